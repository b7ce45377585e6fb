"""The layer kernels (`kernels/layer_kernels.py`) on the GPU against their MLX references, and
the engine's greedy tokens with `--lean-decode fused` against mlx-lm's."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx_lm import load
from tiny_models import build_model, mlx_lm_greedy

from mlx_paged import LLM, SamplingParams
from mlx_paged.bench import ops
from mlx_paged.kernels.layer_kernels import add_rms_norm, qkv_rope, qkv_rope_into_pages, swiglu
from mlx_paged.kernels.paged_attention import current_backend
from mlx_paged.kernels.paged_attention_reference import rotate_half_rope

pytestmark = pytest.mark.gpu

DTYPES = (mx.float16, mx.bfloat16, mx.float32)


def _ulps_apart(got: mx.array, want: mx.array) -> int:
    """The largest distance in units of the last place between equal-dtype arrays (16-bit
    values compared as their integer bit patterns, which order like the values per sign)."""
    if got.dtype == mx.float32:
        a, b = np.array(got).view(np.int32), np.array(want).view(np.int32)
    else:
        a, b = np.array(got.view(mx.int16)), np.array(want.view(mx.int16))
    return int(np.abs(a.astype(np.int64) - b.astype(np.int64)).max())


def _normal(shape, seed, dtype, scale=1.0):
    return (mx.random.normal(shape, key=mx.random.key(seed)) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dim", [64, 2048, 2050])
def test_add_rms_norm_equals_mlx_add_and_rms_norm(dtype, dim):
    h, r = _normal((7, dim), 1, dtype, 3.0), _normal((7, dim), 2, dtype)
    weight = _normal((dim,), 3, dtype)
    total, normed = add_rms_norm(h, r, weight, 1e-5, current_backend())
    assert mx.array_equal(total, h + r).item()  # the add rounds once, as MLX's Add
    # The sum of squares runs in another order than MLX's reduction: a 16-bit normalized value
    # may round one ulp apart, which the weight's product can carry to two. In float32 the
    # order and rsqrtf (2 ulps) show through: a few ulps of 2^-23 each.
    ulps = _ulps_apart(normed, mx.fast.rms_norm(h + r, weight, 1e-5))
    assert ulps <= (2 if dtype != mx.float32 else 16), ulps


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_equals_mlx_lms_swiglu(dtype):
    gate_up = _normal((5, 2 * 1000), 4, dtype, 4.0)
    got = swiglu(gate_up, current_backend())
    want = swiglu(gate_up, None)
    assert got.shape == (5, 1000)
    # Another exp than MLX's may round the sigmoid one ulp apart; the two products carry it.
    assert _ulps_apart(got, want) <= 2


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("heads,rotated", [((8, 2, 64), 64), ((12, 4, 80), 40), ((4, 4, 128), 128)])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_rope_cuts_norms_and_rotates_the_heads(dtype, heads, rotated, qk_norm):
    num_heads, num_kv_heads, head_dim = heads
    rows = 6
    qkv = _normal((rows, (num_heads + 2 * num_kv_heads) * head_dim), 5, dtype)
    positions = mx.array([0, 1, 7, 100, 1000, 4095], dtype=mx.int32)
    inv_freq = (10000.0 ** -(mx.arange(0, rotated, 2) / rotated)).astype(mx.float32)
    norms = None
    y = qkv.reshape(rows, -1, 1, head_dim)
    q, k, v = mx.split(y, [num_heads, num_heads + num_kv_heads], axis=1)
    if qk_norm:
        q_norm, k_norm = nn.RMSNorm(head_dim, eps=1e-6), nn.RMSNorm(head_dim, eps=1e-6)
        q_norm.weight = _normal((head_dim,), 6, dtype)
        k_norm.weight = _normal((head_dim,), 7, dtype)
        norms = (q_norm.weight, k_norm.weight, 1e-6)
        q, k = q_norm(q), k_norm(k)
    with mx.stream(mx.cpu):  # the CPU's cos and sin are libm's (the GPU's may be fast ones)
        want_q = rotate_half_rope(q, positions, inv_freq).astype(dtype)
        want_k = rotate_half_rope(k, positions, inv_freq).astype(dtype)
    got_q, got_k, got_v = qkv_rope(qkv, positions, inv_freq, heads, current_backend(), norms)
    assert got_q.shape == (rows, num_heads, 1, head_dim)
    assert got_k.shape == got_v.shape == (rows, num_kv_heads, head_dim)
    assert mx.array_equal(got_v, v.reshape(rows, num_kv_heads, head_dim)).item()
    # Angles of positions up to 4095 computed two ways may round an ulp apart (2.4e-4 rad in
    # float32 there), which values of a few units carry to about 1e-3.
    tolerance = 1e-2 if dtype != mx.float32 else 1e-3
    for got, want in ((got_q, want_q), (got_k, want_k.reshape(rows, num_kv_heads, head_dim))):
        worst = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
        assert mx.allclose(got, want, atol=tolerance, rtol=tolerance).item(), worst


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "qwen3_moe", "phi3"])
def test_fused_steps_give_mlx_lms_tokens_on_the_gpu(tmp_path, model_type):
    """mlx-lm's own generation on the GPU against the fused step, eager and compiled; the
    kernels round as MLX's ops do, so tiny models' greedy tokens agree. Head size 64: the
    decode kernels' smallest."""
    path = str(build_model(tmp_path / model_type, model_type, head_dim=64,
                           num_attention_heads=4, num_key_value_heads=2))  # fmt: skip
    prompts = [list(range(5, 24)), [11, 12, 13], list(range(30, 70))]
    expected = mlx_lm_greedy(load(path)[0], prompts, 24)
    for compiled in ("off", "on"):
        llm = LLM(path, num_blocks=64, block_size=16, lean_decode="fused",
                  compile_decode=compiled)  # fmt: skip
        got = llm.generate(prompts, SamplingParams(max_tokens=24, ignore_eos=True))
        assert [r.token_ids for r in got] == expected, compiled


@pytest.mark.parametrize("qk_norm", [False, True])
def test_qkv_rope_into_pages_writes_each_rows_keys_and_values_at_its_slot(qk_norm):
    """The page-writing form: the same queries, and the keys and values `qkv_rope` returns
    written at each row's slot; every other page row as it was."""
    num_heads, num_kv_heads, head_dim, rows, dtype = 8, 2, 64, 5, mx.bfloat16
    heads = (num_heads, num_kv_heads, head_dim)
    qkv = _normal((rows, (num_heads + 2 * num_kv_heads) * head_dim), 8, dtype)
    positions = mx.array([0, 3, 17, 200, 4000], dtype=mx.int32)
    inv_freq = (10000.0 ** -(mx.arange(0, head_dim, 2) / head_dim)).astype(mx.float32)
    norms = (_normal((head_dim,), 9, dtype), _normal((head_dim,), 10, dtype), 1e-6)
    norms = norms if qk_norm else None
    k_pages = _normal((96, num_kv_heads, head_dim), 11, dtype)
    v_pages = _normal((96, num_kv_heads, head_dim), 12, dtype)
    mx.eval(k_pages, v_pages)
    k_before, v_before = np.array(k_pages.astype(mx.float32)), np.array(v_pages.astype(mx.float32))
    slots = mx.array([40, 3, 95, 0, 64], dtype=mx.int32).reshape(-1, 1, 1)
    backend = current_backend()
    want_q, want_k, want_v = qkv_rope(qkv, positions, inv_freq, heads, backend, norms)
    got_q = qkv_rope_into_pages(qkv, positions, inv_freq, heads, backend, norms,
                                (k_pages, v_pages), slots)  # fmt: skip
    mx.eval(got_q)
    assert mx.array_equal(got_q, want_q).item()
    written = np.array(slots).reshape(-1)
    k_after, v_after = np.array(k_pages.astype(mx.float32)), np.array(v_pages.astype(mx.float32))
    np.testing.assert_array_equal(k_after[written], np.array(want_k.astype(mx.float32)))
    np.testing.assert_array_equal(v_after[written], np.array(want_v.astype(mx.float32)))
    kept = np.setdiff1d(np.arange(96), written)
    np.testing.assert_array_equal(k_after[kept], k_before[kept])
    np.testing.assert_array_equal(v_after[kept], v_before[kept])


def test_fused_cuda_layer_is_nine_nodes_with_no_page_scatter():
    """On CUDA qkv_rope writes the pages: a fused llama layer is five kernels and four
    matmuls, with no scatter (`bench ops` on the GPU)."""
    if current_backend() != "cuda":
        pytest.skip("the page-writing qkv_rope runs on CUDA only")
    counts = ops.family_ops("llama", "cuda")
    assert counts["fused_per_layer_by_primitive"] == {"CustomKernel": 5, "Matmul": 4}
    assert counts["fused_ops_per_layer"] == 9


def test_fused_steps_keep_mlx_lms_tokens_through_preemption_and_prefix_hits(tmp_path):
    """Few blocks preempt rows mid-decode, and a second round reads the prompts' cached
    blocks: the pages the kernel wrote in place hold what mlx-lm's cache holds."""
    path = str(build_model(tmp_path / "llama", "llama", head_dim=64, num_attention_heads=4,
                           num_key_value_heads=2))  # fmt: skip
    prompts = [list(range(5, 40)), list(range(7, 30)), list(range(30, 70)), [9, 8, 7]]
    expected = mlx_lm_greedy(load(path)[0], prompts, 40)
    llm = LLM(path, num_blocks=12, block_size=16, lean_decode="fused")
    for _ in range(2):
        got = llm.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
        assert [r.token_ids for r in got] == expected
    assert llm.engine.metrics.preemptions_total > 0
