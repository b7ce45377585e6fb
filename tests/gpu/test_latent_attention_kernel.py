"""The MLA decode kernels (`kernels/latent_attention.jinja`, both pass-1 kernels and the merge)
compute what the pure-MLX reference computes over the same latent pages: head counts that do and
do not fill the 16-head tiles, contexts that end inside a block and span several partitions,
scattered block tables; and a tiny DeepSeek-V3 decodes the reference path's greedy tokens on
them."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.kernels.latent_attention import latent_attention_decode, latent_specs, spec_for
from mlx_paged.kernels.latent_attention_reference import latent_attention_reference
from mlx_paged.kernels.paged_attention import current_backend

pytestmark = pytest.mark.gpu

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def _case(spec, heads: int, lens: list[int], seed: int):
    """Queries, pages and tables of `lens` contexts, each row's blocks a random permutation."""
    keys = iter(mx.random.split(mx.random.key(seed), 4))
    dtype, bs = _DTYPES[spec.dtype], spec.block_size
    blocks = [-(-n // bs) for n in lens]
    num_blocks = sum(blocks) + 1
    order = np.random.default_rng(seed).permutation(np.arange(1, num_blocks))
    tables, at = np.zeros((len(lens), max(blocks)), np.int32), 0
    for row, n in enumerate(blocks):
        tables[row, :n] = order[at : at + n]
        at += n
    latent = mx.random.normal((num_blocks, bs, 1, spec.latent_dim), key=next(keys)).astype(dtype)
    rope = mx.random.normal((num_blocks, bs, 1, spec.rope_dim), key=next(keys)).astype(dtype)
    q_latent = mx.random.normal((len(lens), heads, 1, spec.latent_dim), key=next(keys))
    q_rope = mx.random.normal((len(lens), heads, 1, spec.rope_dim), key=next(keys))
    return q_latent.astype(dtype), q_rope.astype(dtype), latent, rope, mx.array(tables)


@pytest.mark.parametrize("heads", [16, 20, 128])
@pytest.mark.parametrize(
    "spec", [s for s in latent_specs("cuda") if s.kernel != "reduce"], ids=lambda s: s.name
)
def test_kernel_equals_the_reference(spec, heads):
    _check_against_the_reference(spec, heads, [1, 37, 530, 1500])  # 1 block, 1-3 partitions


@pytest.mark.parametrize("kernel", ["mma", "simt"])
def test_the_longest_partitions_equal_the_reference(kernel):
    """2,048-token partitions (large grids): one, two and three of them a row."""
    spec = spec_for("cuda", mx.bfloat16, 512, 64, 16, kernel, partition_size=2048)
    _check_against_the_reference(spec, 16, [1, 2100, 4500, 530])


def _check_against_the_reference(spec, heads: int, lens: list[int]) -> None:
    backend = current_backend()
    q_latent, q_rope, latent, rope, tables = _case(spec, heads, lens, seed=heads)
    seq_lens = mx.array(lens, dtype=mx.int32)
    scale = (spec.latent_dim // 4 + spec.rope_dim) ** -0.5
    got = latent_attention_decode(q_latent, q_rope, latent, rope, tables, seq_lens, scale=scale,
                                  backend=backend, kernel=spec.kernel,
                                  partition_size=spec.partition_size)  # fmt: skip
    with mx.stream(mx.cpu):  # the oracle on the CPU: GPU float32 matmuls may use TF32
        want = latent_attention_reference(q_latent, q_rope, latent, rope, tables, seq_lens,
                                          (seq_lens - 1)[:, None], scale=scale)  # fmt: skip
    assert got.shape == want.shape and got.dtype == want.dtype
    err = float(mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max())
    size = float(mx.abs(want.astype(mx.float32)).max())
    tol = 1e-4 if spec.dtype == "float32" else 2e-2
    assert err <= tol * max(size, 1.0), (spec.name, heads, err, size)


def test_a_tiny_deepseek_v3_decodes_the_reference_tokens_on_the_kernel(tmp_path):
    from tiny_models import build_model

    from mlx_paged import LLM, SamplingParams

    path = str(build_model(tmp_path / "dsv3", "deepseek_v3", dtype=mx.bfloat16, kv_lora_rank=128,
                           qk_rope_head_dim=32, num_attention_heads=16))  # fmt: skip
    prompts = [list(range(5, 60)), [11, 12, 13]]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    # On CUDA `auto` picks the tensor-core kernel for 16-bit latent pages; elsewhere ask for it.
    mode = "auto" if current_backend() == "cuda" else "kernel"
    kernel = LLM(path, num_blocks=64, block_size=16, paged_attention=mode)
    reference = LLM(path, num_blocks=64, block_size=16, paged_attention="reference")
    assert kernel.engine.runner.pool.decode_backend is not None
    got = kernel.generate(prompts, params)
    assert kernel.engine.runner.pool.attention_calls["latent_kernel", "decode"] > 0
    want = reference.generate(prompts, params)
    # bf16 rounds the two paths' sums differently; the first tokens must agree.
    assert [r.token_ids[:8] for r in got] == [r.token_ids[:8] for r in want]
