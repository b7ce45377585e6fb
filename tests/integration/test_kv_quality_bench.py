"""`bench kv-quality` end to end on a tiny model: 16-bit pages score against themselves exactly,
quantized ones differ a little, and the result file says so."""

from __future__ import annotations

import argparse
import json

from tiny_models import build_model

from mlx_paged.bench import kv_quality


def test_kv_quality_compares_each_setting_with_16_bit_pages(tmp_path):
    model = build_model(tmp_path / "m", "llama", head_dim=64, num_attention_heads=4,
                        num_key_value_heads=2)  # fmt: skip
    out = tmp_path / "kvq.json"
    args = argparse.Namespace(model=str(model), tokens=80, chunk=24, group_size=32, prompt=16,
                              new=8, out=str(out))  # fmt: skip
    assert kv_quality.main(args) == 0
    rows = json.loads(out.read_text())["settings"]
    assert list(rows) == ["16-bit", "8-bit", "4-bit", "K8 / V4"]
    plain = rows["16-bit"]
    assert plain["perplexity_change"] == 0 and plain["mean_kl"] == 0
    assert plain["top1_agreement"] == 1 and plain["greedy"]["first_difference"] == 8
    for name in ("8-bit", "4-bit", "K8 / V4"):
        assert 0 < rows[name]["mean_kl"] < 0.5
    assert rows["8-bit"]["mean_kl"] < rows["4-bit"]["mean_kl"]
