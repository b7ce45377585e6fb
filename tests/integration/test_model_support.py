"""Which models the paged path serves is decided by running them: what cannot run on pages is
refused at load with the way out; a wrapper around a supported text model runs exactly as the
contiguous path does. Served elsewhere: hybrids (recurrent or convolution state), gemma2 and
llama4, whose attention adapters hand paged attention a score cap or chunks
(`test_hybrid_models.py`); latent attention (`test_latent_models.py`)."""

from __future__ import annotations

import dataclasses

import pytest

from mlx_paged import LLM, SamplingParams

REFUSED = {
    "plamo2": "attention layer 0 cached K/V 1 times and attended through mlx-lm's "
    "scaled_dot_product_attention 0 times",
    "iquestloopcoder": "attention layer 2 cached K/V 1 times and attended through mlx-lm's "
    "scaled_dot_product_attention 2 times",
    "afm7": "this model's forward fails with paged K/V caches",
    "gemma3n:gemma3n_text": "this model's forward fails with paged K/V caches",
    "deepseek_v41": "layer 0 keeps a LayerCache, a cache the paged KV path has no pages",
    "mamba": "this model has no attention layers",
    "rwkv7": "this model has no attention layers",
    "mamba2": "this model has no attention layers",
}


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_models_the_paged_path_cannot_serve_are_refused_with_the_way_out(
    tiny_model_dir, model_type
):
    with pytest.raises(ValueError) as info:
        LLM(str(tiny_model_dir(model_type)), num_blocks=16)
    message = str(info.value)
    assert REFUSED[model_type] in message and "--kv-paged off" in message


def test_attention_computed_by_hand_is_refused_by_the_probe(tiny_model_dir):
    # gemma2 without its adapter (`kv/softcap_attention.py`) scores K/V by hand.
    from mlx_lm import load

    from mlx_paged.kv.attention_hook import install_attention_hook
    from mlx_paged.kv.kv_layout import probe_kv_layout

    model, _ = load(str(tiny_model_dir("gemma2")))
    install_attention_hook()
    with pytest.raises(ValueError, match="attended through mlx-lm's scaled_dot_product_att"):
        probe_kv_layout(model)


def test_a_chunked_cache_without_its_adapter_is_refused_naming_the_layer(tiny_model_dir):
    from mlx_lm import load

    from mlx_paged.kv.cache_plan import plan_caches

    model, _ = load(str(tiny_model_dir("llama4:llama4_text")))
    with pytest.raises(ValueError, match="layer 0 keeps a ChunkedKVCache"):
        plan_caches(model)


def test_mistral3_around_ministral3_is_served_exactly(tiny_model_dir):
    path = str(tiny_model_dir("mistral3:ministral3"))
    prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    paged = LLM(path, num_blocks=32).generate(prompts, params)
    contiguous = LLM(path, kv_paged=False).generate(prompts, params)
    assert [r.token_ids for r in paged] == [r.token_ids for r in contiguous]
    assert all(len(r.token_ids) == 12 for r in paged)


@pytest.mark.parametrize(
    ("model_type", "what"),
    [("gemma2", "soft-capped scores"), ("llama4:llama4_text", "chunks")],
)
def test_fused_rope_is_refused_where_an_adapter_computes_what_it_cannot(
    tiny_model_dir, model_type, what
):
    with pytest.raises(ValueError, match=f"fused RoPE computes plain scores, not {what}"):
        LLM(str(tiny_model_dir(model_type)), num_blocks=16, fused_rope="on")


def test_v_heads_of_another_size_than_k_take_16_bit_pages_and_the_simt_kernels(tiny_model_dir):
    """mimo_v2_flash (K heads 32, V heads 16): its pages keep V at its own size; quantized
    pages, which take equal sizes, are refused with the reason; the SIMT decode kernels take
    such layers at head sizes they are generated for."""
    from mlx_lm import load

    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kv.attention_hook import install_attention_hook
    from mlx_paged.kv.kv_layout import probe_kv_layout
    from mlx_paged.runner.attention_setup import _check_kernel_shape

    path = str(tiny_model_dir("mimo_v2_flash"))
    llm = LLM(path, num_blocks=32, block_size=4)
    pool = llm.engine.runner.pool
    assert {p.k.shape[-1] for p in pool.pages} == {32} and set(pool.value_dims) == {16}
    assert {p.v.shape[-1] for p in pool.pages} == {16}
    with pytest.raises(ValueError, match="use --kv-bits 16"):
        LLM(path, num_blocks=32, block_size=4, kv_bits=8)
    model, _ = load(path)
    install_attention_hook()
    layout = probe_kv_layout(model)
    assert layout.values_differ and layout.shapes[0] == (2, 32, 4, 16)
    shape = layout.by_shape()[0]
    assert shape.value_dim == 16
    with pytest.raises(UnsupportedSpecError, match="head_dim=32 is not generated"):
        _check_kernel_shape("cuda", shape, 16, (16, 16, 0))
    # At K and V head sizes the kernels are generated for, the SIMT kernels take the layer.
    _check_kernel_shape("cuda", dataclasses.replace(shape, head_dim=192, value_head_dim=128), 16,
                        (16, 16, 0))  # fmt: skip
