"""A real `mlx-paged serve` process on loopback, serving the embedded SmolLM2."""

from __future__ import annotations

import pytest
from server_process import start_server


@pytest.fixture(scope="session")
def server(tmp_path_factory, smollm2_dir):
    srv = start_server(
        tmp_path_factory.mktemp("server"), "--log-level", "INFO", "--kv-budget", "512MB"
    )
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
