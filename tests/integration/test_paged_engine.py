"""The paged KV path end to end in the engine: mlx-lm parity, prefix-cache hits and
preemption by recompute give the same tokens, and every block comes back."""

from __future__ import annotations

import pytest
from mlx_lm import stream_generate
from mlx_lm.sample_utils import make_logits_processors

from mlx_paged import LLM, SamplingParams
from mlx_paged.errors import InvalidRequestError
from mlx_paged.kv.prefill_shapes import PrefillShapes

TEXTS = [
    "hi",
    "zebra quilt yodel mango and more words here",
    "zebra quilt yodel mango but other",
    "hello vexed kiwi hello",
    "continuous batching joins",
    "paged attention kv cache block",
]
MAX_TOKENS = [5, 24, 12, 20, 7, 16]


def reference(llm, prompt, max_tokens):
    eos = llm.tokenizer.eos_token_id
    procs = make_logits_processors(logit_bias={eos: -100})
    return [
        r.token
        for r in stream_generate(
            llm.model, llm.tokenizer, prompt, max_tokens=max_tokens, logits_processors=procs
        )
    ]


def params(llm):
    eos = llm.tokenizer.eos_token_id
    return [SamplingParams(max_tokens=m, logit_bias={eos: -100}) for m in MAX_TOKENS]


def assert_pool_full(llm):
    pool = llm.engine.kv.block_pool
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)


@pytest.mark.parametrize("compile_decode", ["off", "on"], ids=["eager", "compiled"])
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_paged_equals_single_sequence_generate(tiny_model_dir, model_type, compile_decode):
    llm = LLM(
        str(tiny_model_dir(model_type)),
        kv_paged=True,
        compile_decode=compile_decode,
        block_size=4,
        num_blocks=96,
        max_num_seqs=4,
        max_num_prefill_seqs=2,
        prefill_step_size=8,
    )
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    results = llm.generate(prompts, params(llm))
    for prompt, m, r in zip(prompts, MAX_TOKENS, results):
        assert r.token_ids == reference(llm, prompt, m)
    assert_pool_full(llm)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_prefix_cache_hit_gives_the_cold_tokens(tiny_model_dir, model_type):
    llm = LLM(str(tiny_model_dir(model_type)), kv_paged=True, block_size=4, num_blocks=128)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    cold = [r.token_ids for r in llm.generate(prompts, params(llm))]
    hits_before = llm.engine.metrics.prefix_cache_hit_tokens_total
    warm = [r.token_ids for r in llm.generate(prompts, params(llm))]
    assert warm == cold
    assert llm.engine.metrics.prefix_cache_hit_tokens_total > hits_before
    assert_pool_full(llm)


def test_token_budget_chunks_a_long_prompt_between_decode_steps(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=6, max_num_batched_tokens=9, prefill_step_size=16)  # fmt: skip
    long_text = " ".join(TEXTS * 4)
    prompts = [llm.tokenizer.encode(t) for t in [*TEXTS, long_text]]
    mixed_steps = []  # steps with decode rows: (all their tokens, prompt tokens)
    schedule_prompts = llm.engine.scheduler.schedule_prompts

    def recorded(num_decode_rows):
        plan = schedule_prompts(num_decode_rows)
        chunks = sum(n for _, n in plan.prefill)
        if num_decode_rows:
            mixed_steps.append((num_decode_rows + len(plan.starting) + chunks, chunks))
        return plan

    llm.engine.scheduler.schedule_prompts = recorded
    eos = llm.tokenizer.eos_token_id
    sampling = [SamplingParams(max_tokens=m, logit_bias={eos: -100}) for m in [*MAX_TOKENS, 6]]
    results = llm.generate(prompts, sampling)
    for prompt, p, r in zip(prompts, sampling, results):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    # The long prompt is prefilled in chunks inside steps that decode, within the budget.
    assert len(prompts[-1]) > 9 and max(total for total, _ in mixed_steps) == 9
    assert sum(chunks for _, chunks in mixed_steps) > 9
    assert_pool_full(llm)


def test_aligned_prefill_shapes_give_the_same_tokens(tiny_model_dir):
    """With `prefill_align` (on by default on CUDA only), forward widths and budget-cut chunk
    ends are multiples of it, and the tokens stay mlx-lm's."""
    # Not paced: the chunks here are the token budget's alone.
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=6, max_num_batched_tokens=21, prefill_step_size=16,
              prefill_chunk_seconds=None)  # fmt: skip
    engine = llm.engine
    engine.runner.pool.prefill_align = engine.scheduler.prefill_align = 8
    widths, steps = [], []
    forward, schedule_prompts = engine.runner._forward, engine.scheduler.schedule_prompts

    def recorded_forward(tokens, meta, **kwargs):
        widths.append(tokens.shape[1])
        return forward(tokens, meta, **kwargs)

    def recorded_schedule(num_decode_rows):
        plan = schedule_prompts(num_decode_rows)
        steps.append([(r.num_computed_tokens, r.num_prefill_tokens) for r, _ in plan.prefill])
        return plan

    engine.runner._forward, engine.scheduler.schedule_prompts = recorded_forward, recorded_schedule
    prompts = [llm.tokenizer.encode(t) for t in [*TEXTS, " ".join(TEXTS * 4)]]
    eos = llm.tokenizer.eos_token_id
    sampling = [SamplingParams(max_tokens=m, logit_bias={eos: -100}) for m in [*MAX_TOKENS, 6]]
    for prompt, p, r in zip(prompts, sampling, llm.generate(prompts, sampling)):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert {w % 8 for w in widths if w > 1} == {0}
    # A chunk cut short (not its prompt's last) ends aligned, unless it is its step's only one.
    cut = [end for chunks in steps for end, total in chunks if end < total - 1]
    unaligned = [c for c in steps for end, total in c if end < total - 1 and end % 8]
    assert len(cut) > 4 and all(len(chunks) == 1 for chunks in unaligned)
    assert engine.metrics.prompt_tokens_total == sum(len(p) for p in prompts)


@pytest.mark.parametrize("compile_decode", ["off", "on"], ids=["eager", "compiled"])
def test_next_turn_hits_the_previous_prompt_and_answer(tiny_model_dir, compile_decode):
    path = str(tiny_model_dir("llama"))
    llm = LLM(path, kv_paged=True, block_size=4, num_blocks=128, compile_decode=compile_decode)
    cold = LLM(path, kv_paged=True, block_size=4, num_blocks=128, enable_prefix_caching=False)
    eos = llm.tokenizer.eos_token_id
    turn = SamplingParams(max_tokens=13, logit_bias={eos: -100})
    history = llm.tokenizer.encode(TEXTS[1])
    for _ in range(3):
        [result] = llm.generate(history, turn)
        assert result.token_ids == cold.generate(history, turn)[0].token_ids
        done = history + result.token_ids
        history = done + llm.tokenizer.encode(" and then")
        [nxt] = llm.generate(history, SamplingParams(max_tokens=1))
        # Every answer token was fed (the last one by the step that found the request done).
        assert nxt.num_cached_tokens == len(done) // 4 * 4
    assert_pool_full(llm)


@pytest.mark.parametrize("compile_decode", ["off", "on"], ids=["eager", "compiled"])
@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_preempt_then_resume_gives_the_same_tokens(tiny_model_dir, model_type, compile_decode):
    roomy = LLM(str(tiny_model_dir(model_type)), kv_paged=True, block_size=4, num_blocks=128)
    prompts = [roomy.tokenizer.encode(t) for t in TEXTS]
    expected = [r.token_ids for r in roomy.generate(prompts, params(roomy))]
    # gemma3_text's blocks are split between a full-attention and a sliding-window group.
    tight = LLM(
        str(tiny_model_dir(model_type)),
        kv_paged=True,
        block_size=4,
        num_blocks={"llama": 22, "gemma3_text": 30}[model_type],
        compile_decode=compile_decode,
    )
    got = [r.token_ids for r in tight.generate(prompts, params(tight))]
    assert got == expected
    assert tight.engine.metrics.preemptions_total > 0
    assert_pool_full(tight)


def test_a_request_that_can_never_fit_is_refused(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=6)
    with pytest.raises(InvalidRequestError) as info:
        llm.generate("hello world", SamplingParams(max_tokens=40))
    assert info.value.code == "kv_cache_too_small"
    assert "--num-blocks" in info.value.message  # the flag that sized this pool
    budget = LLM(
        str(tiny_model_dir("llama")),
        kv_paged=True,
        block_size=4,
        kv_budget_bytes=llm.engine.runner.pool.nbytes,
    )
    with pytest.raises(InvalidRequestError) as info:
        budget.generate("hello world", SamplingParams(max_tokens=40))
    assert "--kv-budget" in info.value.message


def test_smollm2_paged_equals_generate(smollm2_dir):
    llm = LLM(str(smollm2_dir), kv_paged=True, block_size=16, num_blocks=64)
    questions = ["What is the capital of France?", "Name a primary color."]
    prompts = [
        llm.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True
        )
        for q in questions
    ]
    eos = llm.tokenizer.eos_token_id
    results = llm.generate(prompts, SamplingParams(max_tokens=10, logit_bias={eos: -100}))
    for prompt, r in zip(prompts, results):
        assert r.token_ids == reference(llm, prompt, 10)
    assert results[0].text.startswith("The capital of France is Paris.")


def test_default_max_tokens_shrinks_to_the_pool(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=6)
    params = llm.engine.check_request(
        [5, 6], SamplingParams(max_tokens=500), max_tokens_explicit=False
    )
    assert params.max_tokens == (6 - 1 - 1) * 4 - 2
    with pytest.raises(InvalidRequestError) as info:
        llm.engine.check_request([5] * 17, SamplingParams())
    assert info.value.code == "kv_cache_too_small" and info.value.param == "messages"


def test_bucketed_prefill_attention_gives_the_same_tokens(tiny_model_dir):
    """With `prefill_shapes` (on by default on CUDA only), prefill attention runs in
    power-of-two buckets, warmed at the first step: rows from position 0, budget-cut chunks
    and prefix hits all give mlx-lm's tokens."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=6, max_num_batched_tokens=21, prefill_step_size=64)  # fmt: skip
    pool, args = llm.engine.runner.pool, llm.model.args
    shapes = PrefillShapes(args.num_attention_heads, pool.page_shape[2], pool.page_shape[3],
                           pool.dtype)  # fmt: skip
    assert shapes.rows_bucketed
    calls = {"own": 0, "row": 0}
    attend_own, attend_row = shapes.attend_own, shapes.attend_row

    def counted(kind, attend):
        def call(*a, **k):
            calls[kind] += 1
            return attend(*a, **k)

        return call

    shapes.attend_own, shapes.attend_row = counted("own", attend_own), counted("row", attend_row)
    pool.prefill_shapes = shapes
    prompts = [llm.tokenizer.encode(t) for t in [*TEXTS, " ".join(TEXTS * 4)]]
    eos = llm.tokenizer.eos_token_id
    sampling = [SamplingParams(max_tokens=m, logit_bias={eos: -100}) for m in [*MAX_TOKENS, 6]]
    for _ in range(2):  # the second pass hits the prefix cache
        for prompt, p, r in zip(prompts, sampling, llm.generate(prompts, sampling)):
            assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert calls["own"] > 0 and calls["row"] > 0
    assert llm.engine.metrics.prefix_cache_hit_tokens_total > 0
    assert shapes._warm_threads  # warmed by the first step, on the stepping thread
    assert_pool_full(llm)


def test_the_mixed_step_cap_bounds_prompt_work_beside_decode_rows(tiny_model_dir):
    """With `prefill_itl_ratio`, a long prompt that arrives while rows decode is prefilled in
    chunks no larger than the cap's budget at the time, and the tokens stay mlx-lm's."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=400,
              max_num_seqs=6, prefill_step_size=2048, prefill_itl_ratio=2.0)  # fmt: skip
    scheduler, cap = llm.engine.scheduler, llm.engine.pacer.mixed_cap
    long_text = " ".join(TEXTS * 4)
    prompts = [llm.tokenizer.encode(t) for t in [*TEXTS, long_text]]
    mixed_steps = []  # steps with decode rows: (prompt tokens, the cap's budget)
    schedule_prompts = scheduler.schedule_prompts

    def recorded(num_decode_rows):
        budget = scheduler.decoding_prompt_budget
        plan = schedule_prompts(num_decode_rows)
        if num_decode_rows and plan.prefill:
            mixed_steps.append((sum(n for _, n in plan.prefill), budget))
        return plan

    scheduler.schedule_prompts = recorded
    eos = llm.tokenizer.eos_token_id
    sampling = [SamplingParams(max_tokens=m, logit_bias={eos: -100}) for m in [*MAX_TOKENS, 6]]
    for prompt, p, r in zip(prompts, sampling, llm.generate(prompts, sampling)):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert len(prompts[-1]) > 256 and mixed_steps
    assert all(budget is not None and n <= budget for n, budget in mixed_steps)
    assert cap.mixed_steps and cap.decode_steps
    assert_pool_full(llm)
