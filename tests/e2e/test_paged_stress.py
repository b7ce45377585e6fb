"""64 concurrent streaming requests against a paged server whose pool cannot hold them all, a
quarter of the clients hanging up mid-stream: the rest finish with the right tokens, requests
get preempted, and every block comes back. And a plain request whose client hangs up while a
fast engine keeps producing tokens is cancelled."""

from __future__ import annotations

import concurrent.futures
import json
import random
import socket
import time
import urllib.request

import pytest
from server_process import start_server

from mlx_paged import LLM, SamplingParams

pytestmark = pytest.mark.e2e

NUM_REQUESTS = 64
MAX_TOKENS = 24
WORDS = "zebra quilt yodel mango hello vexed kiwi paged block table cache fox lazy dog".split()


def metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {
        ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1])
        for ln in lines
        if ln and not ln.startswith("#")
    }


def stream_tokens(url: str, prompt: list[int], hang_up_after: int | None) -> list[int] | None:
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
            "logit_bias": {"1": -100},
        }
    ).encode()
    req = urllib.request.Request(
        url + "/v1/completions", body, {"Content-Type": "application/json"}
    )
    tokens = []
    with urllib.request.urlopen(req, timeout=600) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            assert "error" not in chunk, chunk
            lp = chunk["choices"][0]["logprobs"]
            if lp:
                tokens += [int(t.split(":")[1]) for t in lp["tokens"]]
            if hang_up_after is not None and len(tokens) >= hang_up_after:
                return None  # leaving the `with` closes the connection mid-stream
    return tokens


def test_64_streams_on_a_small_pool(tmp_path, tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    rng = random.Random(0)
    llm = LLM(str(model_dir), kv_paged=False)  # the contiguous path gives the expected tokens
    prompts = [
        llm.encode(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))))
        for _ in range(NUM_REQUESTS)
    ]
    expected = [
        r.token_ids
        for r in llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, logit_bias={1: -100}))
    ]
    assert all(len(e) == MAX_TOKENS for e in expected)

    srv = start_server(
        tmp_path,
        "--model",
        str(model_dir),
        "--block-size",
        "8",
        "--num-blocks",
        "48",
        "--decode-concurrency",
        "32",
        "--log-level",
        "WARNING",
    )
    try:
        hang_ups = set(rng.sample(range(NUM_REQUESTS), NUM_REQUESTS // 4))
        with concurrent.futures.ThreadPoolExecutor(max_workers=NUM_REQUESTS) as pool:
            futures = [
                pool.submit(stream_tokens, srv.url, p, 3 if i in hang_ups else None)
                for i, p in enumerate(prompts)
            ]
            results = [f.result() for f in futures]
        for i, (got, want) in enumerate(zip(results, expected)):
            if i not in hang_ups:
                assert got == want, f"request {i}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = metrics(srv.url)
            if m["mlx_paged_requests_running"] == 0 and m["mlx_paged_requests_waiting"] == 0:
                break
            time.sleep(0.2)
        assert m["mlx_paged_requests_running"] == 0 and m["mlx_paged_requests_waiting"] == 0
        assert m["mlx_paged_preemptions_total"] > 0
        assert m['mlx_paged_requests_finished_total{reason="abort"}'] >= 1
        assert m["mlx_paged_kv_blocks_total"] == 47
        assert m["mlx_paged_kv_blocks_free"] == (
            m["mlx_paged_kv_blocks_total"] - m["mlx_paged_kv_blocks_cached"]
        )
    finally:
        assert srv.stop() == 0, srv.log()


def test_a_plain_request_stops_when_its_client_hangs_up_while_tokens_flow(tmp_path):
    """The server looks at a waiting client on a clock, not only when the engine is slow: a
    plain (non-streamed) request whose client leaves while tokens keep coming is cancelled
    long before its 8,000 tokens."""
    from raw_http import address, post_bytes
    from tiny_models import build_model

    model_dir = build_model(tmp_path / "model", "llama", max_position_embeddings=16384)
    srv = start_server(tmp_path, "--model", str(model_dir), "--log-level", "WARNING")
    try:
        body = {"prompt": "zebra quilt", "max_tokens": 8000, "logit_bias": {"1": -100}}
        with socket.create_connection(address(srv.url)) as sock:
            sock.sendall(post_bytes("/v1/completions", json.dumps(body).encode()))
            deadline = time.monotonic() + 60
            while metrics(srv.url)["mlx_paged_generation_tokens_total"] < 20:
                assert time.monotonic() < deadline, "no tokens within a minute"
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            m = metrics(srv.url)
            if m.get('mlx_paged_requests_finished_total{reason="abort"}') == 1:
                break
            time.sleep(0.1)
        assert m.get('mlx_paged_requests_finished_total{reason="abort"}') == 1
        assert m.get('mlx_paged_requests_finished_total{reason="length"}', 0) == 0
        assert m["mlx_paged_generation_tokens_total"] < 8000
    finally:
        assert srv.stop() == 0, srv.log()
