"""Start and stop a real `mlx-paged serve` process on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass

from mlx_paged.bench.serve_servers import free_port


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    log_path: str

    def log(self) -> str:
        with open(self.log_path, encoding="utf-8", errors="replace") as f:
            return f.read()

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_server(
    tmp_path, *args: str, timeout: float = 180, env: dict | None = None, preexec_fn=None
) -> Server:
    """Start `mlx-paged serve` with `args` (and `env` added to the environment; `preexec_fn`
    run in the child before it starts); returns once /health answers ok."""
    port = free_port()
    log_path = str(tmp_path / f"server-{port}.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_paged", "serve", "--port", str(port), *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{open(log_path).read()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if json.load(r)["status"] == "ok":
                    return Server(proc, url, log_path)
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"server did not become healthy:\n{open(log_path).read()}")
