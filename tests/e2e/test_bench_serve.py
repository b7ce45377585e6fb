"""`mlx-paged bench serve` end to end: our server and mlx_lm.server on the embedded SmolLM2,
the same load on each, and the offline run."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_bench_serve_measures_both_servers_and_offline(tmp_path, smollm2_dir):
    out = tmp_path / "serve.json"
    run = subprocess.run(
        [sys.executable, "-m", "mlx_paged", "bench", "serve", "--concurrency", "1",
         "--rate", "8", "--min-requests", "1", "--prompt-tokens", "16", "--max-tokens", "2",
         "--warm-up", "1", "--logs", str(tmp_path), "--out", str(out),
         "--ours-args=--kv-budget 256MB"],  # a small pool: zeroing 10% of RAM costs seconds
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    for server in ("mlx-paged", "mlx_lm.server"):
        for level, requests in (("concurrency 1", 2), ("rate 8.0", 1)):
            s = result["servers"][server][level]
            assert (s["requests"], s["errors"]) == (requests, 0), (server, level, s)
            assert 0 < s["output_tokens"] <= 2 * requests and s["ttft_ms"]["p50"] > 0
            assert 10 <= s["mean_prompt_tokens"] <= 20
    assert result["offline"]["concurrency 1"]["output_tokens"] > 0
    assert "| concurrency 1 |" in run.stdout
