"""The models of late 2026 on pages: hybrids (layers that keep recurrent, SSM or convolution state
beside attention layers), Gemma 4 like the 26B (global layers of another K/V shape, K = V)
and the E2B (its last layers attend to K/V earlier layers cached), also inside its multimodal
wrapper, gemma2 (attention scores soft-capped) and llama4 (attention in chunks), through
adapters of their attention, and gemma3_text, whose sliding-window layers free their pages
(KV cache groups).
Greedy tokens equal mlx-lm's own single-sequence generation, a repeated request hits
the prefix cache (attention blocks and a state snapshot) and still gives the same tokens, and so
does a pool small enough to preempt."""

from __future__ import annotations

import re
import shutil

import pytest
from mlx_lm import load
from tiny_models import mlx_lm_greedy

from mlx_paged import LLM, SamplingParams

FAMILIES = [
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_next",
    "lfm2",
    "lfm2_moe",
    "falcon_h1",
    "nemotron_h",
    "granitemoehybrid",
    "olmo_hybrid",
    "gemma3_text",
    "gemma4_text",
    "gemma4_text@e2b",
    "gemma4_text@windows",
    "gemma4:gemma4_text",
    "gemma2",
    "llama4:llama4_text",
    "mimo_v2_flash",
    "gear",
    "baichuan_m1",
]
PROMPTS = [list(range(5, 24)), [11, 12, 13], list(range(30, 70))]
# Models with KV cache groups: the longest request is what the pool holds with every group
# keeping blocks for all its tokens.
SMALL_POOL = {
    "gemma3_text": 28,
    "gemma4_text": 28,
    "gemma4_text@e2b": 28,
    "gemma4_text@windows": 41,
    "gemma4:gemma4_text": 28,
    "mimo_v2_flash": 28,
    "gear": 28,
    "baichuan_m1": 28,
}
MAX_TOKENS = 10


def mlx_lm_tokens(path: str) -> list[list[int]]:
    """Each prompt alone through mlx-lm's `generate_step`, greedy."""
    return mlx_lm_greedy(load(path)[0], PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_hybrid_tokens_equal_mlx_lm_cold_cached_and_preempted(tiny_model_dir, model_type):
    path = str(tiny_model_dir(model_type))
    expected = mlx_lm_tokens(path)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

    llm = LLM(path, num_blocks=64, block_size=4)
    assert [r.token_ids for r in llm.generate(PROMPTS, params)] == expected
    # Snapshots sit at each prompt's last block boundary before its last token: 16, 0, 36;
    # where a group's blocks hold two pages (8 tokens), hits end on 8-token boundaries.
    again = llm.generate(PROMPTS, params)
    assert [r.token_ids for r in again] == expected
    two_pages = max(llm.engine.runner.pool.groups.scales) == 2
    assert [r.num_cached_tokens for r in again] == [16, 0, 32 if two_pages else 36]

    # The prompts fit (16 blocks and a spare), their answers do not (25 blocks); with a window
    # group beside the full one, admission takes a prompt's blocks in both.
    small = LLM(path, num_blocks=SMALL_POOL.get(model_type, 18), block_size=4)
    assert [r.token_ids for r in small.generate(PROMPTS, params)] == expected
    # A window group frees enough that these answers fit: `test_windows_free_their_pages`.
    assert small.engine.metrics.preemptions_total > 0 or model_type in SMALL_POOL


# Windows of 8 in pages of 4: gemma3_text has 2 full-attention layers and 2 window ones (one
# window group sharing the full layers' page arrays); Gemma 4 here has 2 global layers of half
# the window layers' K/V and 4 window ones (two window groups; the global layers' blocks hold
# two pages, 8 tokens). Per group: window, blocks held after 80 tokens, the small pool.
WINDOW_MODELS = {
    "gemma3_text": ((None, 8), 20, 44),
    "gemma4_text@windows": ((None, 8, 8), 10, 52),
}


@pytest.mark.parametrize("model_type", WINDOW_MODELS)
def test_windows_free_their_pages_and_stay_exact_under_preemption(tiny_model_dir, model_type):
    windows, full_blocks, small_pool = WINDOW_MODELS[model_type]
    path = str(tiny_model_dir(model_type))
    prompts, new = [list(range(5, 45)), list(range(50, 70)), [7, 8, 9]], 40
    expected = mlx_lm_greedy(load(path)[0], prompts, new)
    params = SamplingParams(max_tokens=new, ignore_eos=True)
    llm = LLM(path, num_blocks=128, block_size=4)
    kv = llm.engine.kv
    assert kv.group_windows == windows
    held, engine = [], llm.engine
    stream = engine.add_request(prompts[0], params)
    engine.drain_inbox()
    while engine.scheduler.has_unfinished_requests():
        engine.step()
        groups = kv.req_to_blocks.get(stream.request_id)
        if groups:
            held.append([sum(not b.is_null for b in blocks) for blocks in groups])
    # The full group keeps every block of the 80 tokens; each window group at most what a
    # window of 8 and the step's token reach (3 blocks of 4), past the prompt's own.
    assert held[-1][0] == full_blocks
    assert all(max(h[g] for h in held[1:]) <= 3 for g in range(1, len(windows)))
    assert [r.token_ids for r in llm.generate(prompts, params)] == expected
    # Twice the requests in a pool that just holds the longest: preempted and still exact.
    small = LLM(path, num_blocks=small_pool, block_size=4)
    assert [r.token_ids for r in small.generate(prompts * 2, params)] == expected * 2
    assert small.engine.metrics.preemptions_total > 0


# mlx-lm's batched caches get these wrong for prompts of different lengths (checked at load);
# gemma2's hand-made scores take the batch's (B, 1, L, T) mask against (B, KV, repeats, L, T).
BATCHES_WRONGLY = {"olmo_hybrid", "gemma2"}
# mlx-lm's ChunkedKVCache has no batched form: the contiguous path refuses llama4 at load.
CANNOT_BATCH = {"llama4:llama4_text"}


@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_contiguous_path_equals_mlx_lm_batching_only_where_that_is_exact(
    tiny_model_dir, model_type
):
    path = str(tiny_model_dir(model_type))
    if model_type in CANNOT_BATCH:
        with pytest.raises(ValueError, match="its caches cannot be batched"):
            LLM(path, kv_paged=False)
        return
    llm = LLM(path, kv_paged=False)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    assert [r.token_ids for r in llm.generate(PROMPTS, params)] == mlx_lm_tokens(path)
    serial = model_type in BATCHES_WRONGLY
    assert (llm.engine.scheduler.max_num_seqs == 1) == serial


@pytest.mark.parametrize(
    "model_type", ["qwen3_5", "nemotron_h", "gemma4_text", "gemma2", "llama4:llama4_text"]
)
def test_8_bit_pages_serve_every_kind_of_attention_layer(tmp_path, model_type):
    # Head dim 32, so the pages quantize in groups of 32 (gemma4_text: two page shapes).
    from tiny_models import build_model

    path = str(build_model(tmp_path / "m", model_type, head_dim=32))
    expected = mlx_lm_tokens(path)
    llm = LLM(path, num_blocks=64, block_size=4, kv_bits=8, kv_group_size=32)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    got = [r.token_ids for r in llm.generate(PROMPTS, params)]
    assert all(p.k_bits == p.v_bits == 8 for p in llm.engine.runner.pool.pages)
    # A prompt's first token attends to its own unquantized K/V: exact. Later steps read 8-bit
    # pages; these random models flip at most a few near-ties (27 of 30 or more measured).
    assert [g[0] for g in got] == [e[0] for e in expected]
    same = sum(a == b for g, e in zip(got, expected) for a, b in zip(g, e))
    assert same >= 0.8 * len(PROMPTS) * MAX_TOKENS


# ChatML's shape: each turn ends with an end-of-turn token, and the generation prompt opens the
# assistant's turn exactly as the next turn renders it, so a turn's prompt is a prefix of the next.
CHATML = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}\n{{ m['content'] }}<|eos|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}"
)


def test_a_multi_turn_chat_on_a_qwen3_5_like_model_reuses_its_previous_turn(
    tiny_model_dir, tmp_path
):
    path = tmp_path / "qwen3_5-chatml"
    shutil.copytree(tiny_model_dir("qwen3_5"), path)
    (path / "chat_template.jinja").write_text(CHATML)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    llm = LLM(str(path), num_blocks=128, block_size=4)
    chat = [{"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]
    (first,) = llm.chat(chat, params)
    chat += [
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "paged attention kv cache block table"},
    ]
    (second,) = llm.chat(chat, params)
    # The first turn's prompt, up to a snapshot at one of its last two block boundaries.
    assert len(first.prompt_token_ids) - 8 <= second.num_cached_tokens < len(first.prompt_token_ids)
    llm.engine.kv.reset_prefix_cache()
    (cold,) = llm.chat(chat, params)
    assert cold.num_cached_tokens == 0 and cold.token_ids == second.token_ids


def test_metrics_count_state_slots_and_snapshots(tiny_model_dir):
    from mlx_paged.engine.metrics import render_prometheus

    llm = LLM(str(tiny_model_dir("qwen3_5")), num_blocks=64, block_size=4, max_num_seqs=4,
              max_num_prefill_seqs=2)  # fmt: skip
    llm.generate(PROMPTS, SamplingParams(max_tokens=4, ignore_eos=True))
    lines = dict(
        line.rsplit(" ", 1) for line in render_prometheus(llm.engine).splitlines() if line[0] != "#"
    )
    assert lines["mlx_paged_state_slots_total"] == "12"  # 2 x (4 + 2) live requests
    assert lines["mlx_paged_state_slots_running"] == "0"
    # Prompts of 19 and 40 tokens in blocks of 4: snapshots at 12, 16 and 32, 36.
    assert lines["mlx_paged_state_snapshots"] == "4"
    assert lines["mlx_paged_kv_cache_bytes"] == "0"


def test_the_readme_model_list_names_every_family_served_here():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    models = readme.split("## Models", 1)[1].split("\n## ", 1)[0]
    names = {name for f in FAMILIES for name in f.split("@")[0].split(":")}
    assert [n for n in sorted(names) if not re.search(rf"\b{n}\b", models)] == []


def test_quantized_pages_keep_layers_of_another_shape_in_one_group(tmp_path):
    """Blocks of several pages read the arrays at another shape, which quantized rows cannot
    be: with --kv-bits below 16 such a model's windows keep their pages."""
    from tiny_models import build_model

    path = str(build_model(tmp_path / "g4", "gemma4_text@windows", head_dim=32,
                           global_head_dim=32))  # fmt: skip
    assert LLM(path, num_blocks=64, block_size=4).engine.runner.pool.groups.scales == (2, 1, 1)
    quantized = LLM(path, num_blocks=64, block_size=4, kv_bits=8, kv_group_size=32)
    assert quantized.engine.kv.group_windows == (None,)
