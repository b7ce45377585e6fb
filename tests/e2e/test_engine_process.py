"""The engine core in its own process: killing it mid-stream fails every client at once,
`/health` says 503, a new engine process starts and the server serves again."""

from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time

import pytest
from server_process import start_server
from test_lifecycle import FRANCE, MODEL, open_long_stream, request

pytestmark = pytest.mark.e2e


def engine_pids(srv) -> list[int]:
    return [int(pid) for pid in re.findall(r"engine process (\d+) serves", srv.log())]


def wait_healthy(srv, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if request(srv.url, "GET", "/health")[0] == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"the server did not serve again:\n{srv.log()}")


def test_killing_the_engine_mid_stream_fails_clients_and_the_server_recovers(tmp_path):
    srv = start_server(tmp_path, "--kv-budget", "256MB")
    try:
        [pid] = engine_pids(srv)
        assert pid != srv.proc.pid
        stream = open_long_stream(srv.url)
        assert stream.status == 200
        first = stream.readline()  # the role chunk, then tokens: the engine is generating
        assert first.startswith(b"data: ")
        assert stream.readline() == b"\n" and stream.readline().startswith(b"data: ")
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            body = {
                "model": MODEL,
                "messages": FRANCE,
                "max_tokens": 2000,
                "logit_bias": {"2": -100},
            }
            whole = pool.submit(request, srv.url, "POST", "/v1/chat/completions", body)
            time.sleep(0.5)  # the non-streamed request is in the engine too
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            rest = stream.read()  # the server ends the stream: nothing hangs
            ended = time.monotonic() - killed
            status, data = whole.result(timeout=10)
        assert ended < 1.0, ended
        assert b"the engine process died" in rest and rest.endswith(b"data: [DONE]\n\n")
        assert status == 500 and b"the engine process died" in data
        status, data = request(srv.url, "GET", "/health")
        assert status == 503 and b"a new one is starting" in data
        status, data = request(srv.url, "POST", "/v1/chat/completions", body)
        assert status == 503 and b"service_unavailable" in data

        wait_healthy(srv)
        [_, new_pid] = engine_pids(srv)
        assert new_pid != pid
        body = {"model": MODEL, "messages": FRANCE, "max_tokens": 8}
        status, data = request(srv.url, "POST", "/v1/chat/completions", body)
        assert status == 200 and b'"finish_reason"' in data
        _, metrics = request(srv.url, "GET", "/metrics")
        assert b"mlx_paged_engine_restarts_total 1\n" in metrics
        assert b"mlx_paged_engine_up 1\n" in metrics
    finally:
        assert srv.stop() == 0, srv.log()
    assert not os.path.exists(f"/proc/{new_pid}") or _is_zombie(new_pid)


def _is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(")")[-1].split()[0] == "Z"
