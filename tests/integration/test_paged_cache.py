"""A forward through paged caches + the reference attention equals mlx-lm's own caches."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
from tiny_models import build_model

from mlx_paged.kv.attention_hook import check_model_supported, install_attention_hook
from mlx_paged.kv.page_arrays import make_slot_mapping
from mlx_paged.kv.paged_cache import (
    PagedAttentionMetadata,
    PagedKVPool,
    PagedLayerCache,
)


def metadata(tables, lens_before, num_new, block_size, width):
    """Rows with `lens_before` cached tokens each adding `num_new[b]` tokens (padded to width)."""
    max_blocks = max(len(t) for t in tables)
    bt = mx.array([t + [0] * (max_blocks - len(t)) for t in tables], dtype=mx.int32)
    slots = []
    for table, start, n in zip(tables, lens_before, num_new):
        for i in range(width):
            pos = start + i
            slots.append(table[pos // block_size] * block_size + pos % block_size if i < n else 0)
    return PagedAttentionMetadata(
        block_tables=bt,
        context_lens=mx.array([s + n for s, n in zip(lens_before, num_new)], dtype=mx.int32),
        offsets=mx.array(lens_before, dtype=mx.int32),
        slot_mapping=make_slot_mapping(slots),
        num_query_tokens=width,
    )


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_paged_prefill_and_decode_match_contiguous(tiny_model_dir, model_type):
    model, tok = load(str(tiny_model_dir(model_type)))
    install_attention_hook()
    check_model_supported(model_type)
    args = model.args
    block_size = 4
    pool = PagedKVPool(
        len(model.layers),
        num_blocks=16,
        block_size=block_size,
        num_kv_heads=args.num_key_value_heads,
        head_dim=args.head_dim,
    )
    prompts = [tok.encode("zebra quilt yodel mango"), tok.encode("hello vexed kiwi")]
    assert len(prompts[0]) > 12 and len(prompts[1]) > 8  # past gemma3's window of 8
    # Scattered, non-contiguous block ids per row, room for prompt + 5 tokens.
    tables = [
        [7, 2, 11, 5, 9, 1, 12, 15][: -(-(len(prompts[0]) + 5) // block_size)],
        [3, 14, 8, 4, 6, 10, 13][: -(-(len(prompts[1]) + 5) // block_size)],
    ]

    steps = 4
    for row, prompt in enumerate(prompts):
        cache = make_prompt_cache(model)
        ref_logits = [model(mx.array([prompt]), cache=cache)[:, -1]]
        tokens = [int(mx.argmax(ref_logits[-1]).item())]
        for _ in range(steps):
            ref_logits.append(model(mx.array([[tokens[-1]]]), cache=cache)[:, -1])
            tokens.append(int(mx.argmax(ref_logits[-1]).item()))

        # The same sequence as one row of a padded paged batch.
        width = max(len(p) for p in prompts)
        lens = [0, 0]
        new = [len(p) for p in prompts]
        batch = mx.array([p + [0] * (width - len(p)) for p in prompts])
        meta = metadata(tables, lens, new, block_size, width)
        caches = [PagedLayerCache(pool, i, meta) for i in range(len(model.layers))]
        logits = model(batch, cache=caches)
        got = [logits[row, new[row] - 1]]
        lens = list(new)
        feed = [[int(mx.argmax(logits[r, new[r] - 1]).item())] for r in range(2)]
        for _ in range(steps):
            meta = metadata(tables, lens, [1, 1], block_size, 1)
            caches = [PagedLayerCache(pool, i, meta) for i in range(len(model.layers))]
            logits = model(mx.array(feed), cache=caches)
            got.append(logits[row, 0])
            feed = [[int(mx.argmax(logits[r, 0]).item())] for r in range(2)]
            lens = [n + 1 for n in lens]
        # GPUs run float32 matmuls through TF32 tensor cores, so batch shape moves logits ~1e-3.
        tol = 1e-4 if mx.default_device() == mx.cpu else 1e-2
        for ref, ours in zip(ref_logits, got):
            np.testing.assert_allclose(np.array(ours), np.array(ref[0]), rtol=tol, atol=tol)


def test_unsupported_families_are_refused():
    with pytest.raises(ValueError, match="--kv-paged off"):
        check_model_supported("kimi_vl")


def buffer_address(a: mx.array) -> int:
    view = np.asarray(a)  # zero-copy on the CPU; dropped at once so it holds no reference
    address = view.__array_interface__["data"][0]
    del view
    return address


def _page_arrays(pool) -> list[mx.array]:
    if pool.quantized:
        return [p.rows for p in pool.pages]
    return [a for p in pool.pages for a in p]


@pytest.mark.parametrize("kv_bits,lean", [(16, "on"), (4, "on"), (16, "fused")])
def test_decode_step_writes_the_pool_in_place(tiny_model_dir, tmp_path_factory, kv_bits, lean):
    """A decode step scatters into the pages without copying them: every page array keeps its
    buffer (MLX donates it to the scatter only when the pool holds the sole reference); on
    quantized pages, the one array of rows of each layer; the fused lean step's rows too."""
    from mlx_paged import LLM, SamplingParams

    if kv_bits == 16:
        model = tiny_model_dir("llama")
    else:  # groups of 32 need a head dim they divide
        model = build_model(tmp_path_factory.mktemp("llama64"), "llama", head_dim=64)
    llm = LLM(str(model), kv_paged=True, block_size=16, num_blocks=64, kv_bits=kv_bits,
              kv_group_size=32, lean_decode=lean)  # fmt: skip
    engine = llm.engine
    pool = engine.runner.pool
    engine.add_request(llm.encode("hello world"), SamplingParams(max_tokens=20, ignore_eos=True))
    engine.drain_inbox()
    for _ in range(4):  # prefill, start, first decodes
        engine.step()
    assert engine.scheduler.running
    for _ in range(3):
        mx.synchronize()
        before = [buffer_address(p) for p in _page_arrays(pool)]
        engine.step()
        mx.synchronize()
        assert [buffer_address(p) for p in _page_arrays(pool)] == before
