"""Past descriptor 1023: a server started with the usual soft limit of 1024 open files raises it
toward `--max-connections`, and with 1,100 idle connections open its liveness checks (which
`select.select` would refuse there) still tell a waiting client from one that left."""

from __future__ import annotations

import json
import re
import resource
import socket

import pytest
from raw_http import address, exchange, parse_reply, post_bytes
from server_process import start_server

pytestmark = pytest.mark.e2e

IDLE = 1100
HI = [{"role": "user", "content": "Hi"}]


def _soft_limit_1024() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


@pytest.fixture(scope="module")
def open_files():
    """This test process may hold the idle connections and a few more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 256:
        pytest.skip(f"the hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 256), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_liveness_past_descriptor_1023(tmp_path, smollm2_dir, open_files):
    srv = start_server(
        tmp_path,
        "--max-connections", "2000", "--max-tokens", "6", "--kv-budget", "64MB",
        preexec_fn=_soft_limit_1024,
    )  # fmt: skip
    idle = []
    try:
        # (MLX raises the soft limit to 2048 itself on import, short of the 2000 + spares.)
        assert re.search(r"raised the open-file limit from \d+ to 2128", srv.log())
        idle = [socket.create_connection(address(srv.url)) for _ in range(IDLE)]
        body = {"messages": HI, "max_tokens": 6, "logit_bias": {"2": -100}}
        reply = parse_reply(
            exchange(srv.url, post_bytes("/v1/chat/completions", json.dumps(body).encode()), 120)
        )
        assert reply.status == 200, reply.body
        assert reply.json()["usage"]["completion_tokens"] == 6
        raw = exchange(
            srv.url,
            post_bytes("/v1/chat/completions", json.dumps({**body, "stream": True}).encode()),
            120,
        )
        events = [line for line in raw.split(b"\n") if line.startswith(b"data: {")]
        contents = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events
                    if json.loads(e[6:])["choices"]]  # fmt: skip
        assert "".join(c or "" for c in contents), raw[-2000:]
        assert b'"error"' not in raw and raw.rstrip().endswith(b"data: [DONE]")
    finally:
        for sock in idle:
            sock.close()
        assert srv.stop() == 0, srv.log()
    assert "Traceback" not in srv.log()
