"""`mlx-paged bench structured` end to end on the embedded SmolLM2: both arms measured through
the real server, the constrained one's output shaped by the schema."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_bench_structured_measures_both_arms(tmp_path, smollm2_dir):
    out = tmp_path / "structured.json"
    run = subprocess.run(
        [sys.executable, "-m", "mlx_paged", "bench", "structured", "--concurrency", "2",
         "--requests", "2", "--rounds", "1", "--prompt-tokens", "16", "--max-tokens", "6",
         "--logs", str(tmp_path), "--out", str(out), "--ours-args=--kv-budget 256MB"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    (round_,) = result["rounds"]
    for arm in ("free", "json_schema"):
        s = round_[arm]
        assert (s["requests"], s["errors"]) == (2, 0), (arm, s)
        assert 0 < s["output_tokens"] <= 12 and s["output_tok_s"] > 0
    constrained = round_["json_schema"]
    assert constrained["finish_reasons"] == {"length": 2}  # the schema outlasts 6 tokens
    assert constrained["sample_output"].startswith('{"people": [')
    assert result["ratio"] == pytest.approx(result["json_schema_tok_s"] / result["free_tok_s"])
    assert "json_schema" in run.stdout
