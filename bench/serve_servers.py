"""Start and stop the servers `bench serve` measures: ours and a peer, one at a time, each a
process of its own on a free loopback port, with its output in a log file."""

from __future__ import annotations

import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

# The peer's command; {python}, {model}, {port} and {concurrency} are filled in.
DEFAULT_PEER = (
    "{python} -m mlx_lm.server --model {model} --port {port} --decode-concurrency {concurrency}"  # noqa: E501
)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ours_command(model: str, port: int, concurrency: int, extra: str = "") -> list[str]:
    """`mlx-paged serve` on `model` with the peer's decode concurrency, plus `extra` flags."""
    return [sys.executable, "-m", "mlx_paged", "serve", "--model", model, "--port", str(port),
            "--decode-concurrency", str(concurrency), *shlex.split(extra)]  # fmt: skip


def peer_command(template: str, model: str, port: int, concurrency: int) -> list[str]:
    """The peer's command line from its template."""
    filled = template.format(python=shlex.quote(sys.executable), model=shlex.quote(model),
                             port=port, concurrency=concurrency)  # fmt: skip
    return shlex.split(filled)


@contextmanager
def running_server(command: list[str], port: int, log_path: Path, timeout: float = 600):
    """Run `command` until the block ends; yields its base URL once `GET /v1/models` answers.

    Raises:
        RuntimeError: the server exited or did not answer within `timeout`, with its log's tail.
    """
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(proc, url, log_path, timeout)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(proc: subprocess.Popen, url: str, log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"server did not answer within {timeout:.0f} s:\n{_tail(log_path)}")


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
