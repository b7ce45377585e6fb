"""Quantized pages on the GPU: the quantize kernel writes the rows MLX's own ops make, and the
engine's greedy tokens over quantized pages are the same with the decode kernels as with the
reference path, eager and compiled."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams
from mlx_paged.kernels.paged_attention import current_backend
from mlx_paged.kernels.quantize_rows import quantize_rows, quantize_rows_specs
from mlx_paged.kernels.quantized_pages import QuantizedKVPages, pack_rows

pytestmark = pytest.mark.gpu

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


@pytest.mark.parametrize("spec", quantize_rows_specs("cuda"), ids=lambda s: s.name)
def test_kernel_rows_equal_mlx_ops_rows(spec):
    """Groups that hold both signs (where MLX's GPU quantize and its CPU one agree): every
    word of every row, padding included, equals `pack_rows` (mx.quantize, then the parts)."""
    if current_backend() is None:
        pytest.skip("needs MLX's Metal or CUDA backend")
    dtype = _DTYPES[spec.dtype]
    keys = mx.random.normal((37, 3, spec.head_dim), key=mx.random.key(1)).astype(dtype)
    values = (mx.random.normal((37, 3, spec.head_dim), key=mx.random.key(2)) * 3).astype(dtype)
    pages = QuantizedKVPages.zeros((1, 1, 3, spec.head_dim), dtype, spec.k_bits, spec.v_bits,
                                   spec.group_size)  # fmt: skip
    got = np.array(quantize_rows(pages, keys, values))
    want = np.array(pack_rows(pages, keys, values))
    assert got.shape == want.shape == (37, 3, spec.row_layout.row_bytes // 4)
    mismatched = int((got != want).sum())
    assert mismatched == 0, f"{mismatched} of {got.size} words differ"


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64)])
def test_engine_tokens_over_quantized_pages_equal_the_reference_path(tmp_path, bits, group):
    folder = build_model(
        tmp_path / "llama", "llama", head_dim=64, num_attention_heads=4, num_key_value_heads=2
    )
    prompts = ["hello world", "the quick brown fox jumps over the lazy dog", "paged"]
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    results = {}
    for mode, compiled in (("reference", "off"), ("kernel", "off"), ("kernel", "on")):
        llm = LLM(str(folder), block_size=16, num_blocks=64, paged_attention=mode,
                  compile_decode=compiled, kv_bits=bits, kv_group_size=group)  # fmt: skip
        tokens = [r.token_ids for r in llm.generate(prompts, params)]
        results[mode, compiled] = tokens, dict(llm.engine.runner.pool.attention_calls)
    reference, calls = results["reference", "off"]
    assert calls.get(("kernel", "decode"), 0) == 0 and all(len(t) == 32 for t in reference)
    for compiled in ("off", "on"):
        tokens, calls = results["kernel", compiled]
        assert tokens == reference
        # Every decode forward (31 of them, the rows batched) ran the kernel in each layer.
        assert calls.get(("kernel", "decode"), 0) >= 31 and ("reference", "decode") not in calls
