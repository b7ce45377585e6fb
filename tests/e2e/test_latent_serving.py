"""A tiny DeepSeek-V3 (latent attention) served by a real `mlx-paged serve` over loopback, through
the official `openai` client: chat and streamed completions give the tokens the Python API
gives, a repeated prompt reuses its latent pages, and /metrics counts the latent paths."""

from __future__ import annotations

import urllib.request

import pytest
from server_process import start_server

from mlx_paged import LLM, SamplingParams

pytestmark = pytest.mark.e2e


def test_latent_pages_served_over_http(tmp_path, tiny_model_dir):
    from openai import OpenAI

    model_dir = str(tiny_model_dir("deepseek_v3"))
    prompt = list(range(5, 40))
    no_eos = {1: -100.0}  # the tiny tokenizer's EOS
    params = SamplingParams(max_tokens=12, logit_bias=no_eos)
    want = LLM(model_dir, num_blocks=64).generate([prompt], params)
    srv = start_server(tmp_path, "--model", model_dir, "--num-blocks", "64", "--log-level", "INFO")
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for _ in range(2):  # the second run starts from the first's cached blocks
            stream = client.completions.create(
                model=model_dir, prompt=prompt, max_tokens=12, stream=True, logprobs=0,
                logit_bias={"1": -100}, extra_body={"return_tokens_as_token_ids": True},
            )  # fmt: skip
            tokens = [int(t.split(":")[1]) for chunk in stream if chunk.choices[0].logprobs
                      for t in chunk.choices[0].logprobs.tokens]  # fmt: skip
            assert tokens == want[0].token_ids
        chat = client.chat.completions.create(
            model=model_dir, messages=[{"role": "user", "content": "hello world"}], max_tokens=6
        )
        assert chat.choices[0].finish_reason in ("stop", "length")
        with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'path="latent_reference"' in text
        hits = [ln for ln in text.splitlines() if ln.startswith("mlx_paged_prefix_cache_hit")]
        assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 32
    finally:
        assert srv.stop() == 0, srv.log()
