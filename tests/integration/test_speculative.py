"""Speculative decoding with prompt lookup on tiny random-weight models: greedy output equals
plain decoding's under batching (rows joining and leaving) and preemption, drafts are both
accepted and rejected on the way, rejected K/V goes back to the pool, and sampled output
follows the same distribution as plain decoding's."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest

from mlx_paged import LLM, SamplingParams

# Prompts that repeat themselves, so lookup drafts; lengths and limits differ, so rows join
# and leave the batch at different steps.
PROMPTS = [
    [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6],
    list(range(20, 60)),
    [3, 4] * 10,
    [40, 41, 42, 43, 44] * 3 + [99, 98],
    [11, 12, 13],
]
LIMITS = [40, 12, 25, 33, 7]


def _speculating(folder, **kwargs) -> LLM:
    llm = LLM(str(folder), draft_model="ngram", num_draft_tokens=4, **kwargs)
    llm.engine.runner.spec_policy.adaptive = False  # every step that may speculate does
    return llm


def _greedy(llm: LLM, prompts=PROMPTS, limits=LIMITS) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in limits]
    return [r.token_ids for r in llm.generate(prompts, params)]


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("compiled", ["off", "on"])
def test_greedy_output_is_plain_decodings(tiny_model_dir, model_type, compiled):
    folder = tiny_model_dir(model_type)
    plain = _greedy(LLM(str(folder), num_blocks=64, compile_decode=compiled))
    llm = _speculating(folder, num_blocks=64, compile_decode=compiled)
    assert _greedy(llm) == plain
    runner = llm.engine.runner
    assert runner.spec_drafts > 0
    assert 0 < runner.spec_accepted_tokens < runner.spec_draft_tokens  # some of each
    # Every block is back in the pool once the requests are done (rejected drafts' too).
    pool = llm.engine.kv.block_pool
    assert pool.num_free_blocks == pool.num_usable_blocks


def test_greedy_output_survives_preemption(tiny_model_dir):
    folder = tiny_model_dir("llama")
    prompts, limits = [p * 2 for p in PROMPTS] * 2, LIMITS * 2
    plain = _greedy(LLM(str(folder), num_blocks=14, block_size=16), prompts, limits)
    llm = _speculating(folder, num_blocks=14, block_size=16)
    assert _greedy(llm, prompts, limits) == plain
    assert llm.engine.metrics.preemptions_total > 0 and llm.engine.runner.spec_drafts > 0


def test_a_request_may_turn_speculation_off(tiny_model_dir):
    llm = _speculating(tiny_model_dir("llama"), num_blocks=64)
    params = SamplingParams(max_tokens=20, ignore_eos=True, speculate=False)
    llm.generate(PROMPTS[:1], params)
    assert llm.engine.runner.spec_drafts == 0


def test_stop_tokens_and_max_tokens_end_a_row_inside_its_draft(tiny_model_dir):
    """A draft that runs past `max_tokens` or through a stop token ends where plain decoding
    would: the tokens after the end are not outputs."""
    folder = tiny_model_dir("llama")
    free = _greedy(LLM(str(folder), num_blocks=64), PROMPTS[:1], [30])[0]
    stop = free[12]
    params = SamplingParams(max_tokens=30, stop_token_ids=[stop])
    plain = LLM(str(folder), num_blocks=64).generate(PROMPTS[:1], params)[0]
    spec = _speculating(folder, num_blocks=64).generate(PROMPTS[:1], params)[0]
    assert (spec.token_ids, spec.finish_reason) == (plain.token_ids, plain.finish_reason)
    assert spec.finish_reason == "stop" and len(spec.token_ids) == free.index(stop)


def test_sampled_output_follows_the_target_distribution(tiny_model_dir):
    """Three tokens sampled from the top 3 at temperature 1, many times, with and without
    speculation: the two samples of the 27 outcomes agree (chi-square, two samples), while
    drafts were both accepted and rejected."""
    folder = tiny_model_dir("llama")
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9, 10, 5, 6, 7, 8, 9, 10, 5, 6]
    counts = []
    for speculate in (False, True):
        llm = (
            _speculating(folder, num_blocks=256) if speculate else LLM(str(folder), num_blocks=256)
        )
        mx.random.seed(1)
        results = llm.generate([prompt] * 1200, params)
        counts.append(Counter(tuple(r.token_ids) for r in results))
    runner = llm.engine.runner
    assert 0 < runner.spec_accepted_tokens < runner.spec_draft_tokens
    outcomes = set(counts[0]) | set(counts[1])
    statistic = sum(
        (counts[0][o] - counts[1][o]) ** 2 / (counts[0][o] + counts[1][o]) for o in outcomes
    )
    # Two equal-size samples: the statistic is chi-square with len(outcomes) - 1 degrees of
    # freedom; 60 is past its 0.999 quantile for up to 27 outcomes (54.1 at 26 degrees).
    assert len(outcomes) > 3 and statistic < 60, (statistic, counts)


def test_models_with_recurrent_state_and_fused_rope_are_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="recurrent state"):
        LLM(str(tiny_model_dir("qwen3_5")), draft_model="ngram")
    with pytest.raises(ValueError, match="fused-rope off"):
        LLM(str(tiny_model_dir("llama")), draft_model="ngram", fused_rope="on")
    with pytest.raises(ValueError, match="does not share the served model's tokenizer"):
        LLM(str(tiny_model_dir("llama")), draft_model=str(_thinking_model(tiny_model_dir)))
    with pytest.raises(ValueError, match="paged KV path"):
        LLM(str(tiny_model_dir("llama")), draft_model="ngram", kv_paged=False)


def test_structured_rows_speculate_within_their_grammar(tiny_model_dir, tiny_tokenizer):
    """Grammar rows draft too: each query row gets the mask of its place in the draft, the
    matcher advances by accepted tokens only, so greedy JSON equals plain decoding's and
    validates; free rows in the same batch keep their own tokens."""
    import json

    import jsonschema

    from mlx_paged.structured.grammars import json_schema_grammar

    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {
        "enum": ["alpha", "beta"]}, "minItems": 6, "maxItems": 6}}, "required": ["tags"],
        "additionalProperties": False}  # fmt: skip
    example = '{"tags": ["alpha", "beta", "alpha", "beta", "alpha", "beta"]}'
    prompts = [tiny_tokenizer.encode(example * 2), PROMPTS[0], tiny_tokenizer.encode(example)]
    grammar = json_schema_grammar(schema, "response_format")
    constrained = SamplingParams(max_tokens=80, grammar=grammar)
    params = [constrained, SamplingParams(max_tokens=30, ignore_eos=True), constrained]
    folder = tiny_model_dir("llama")
    plain = LLM(str(folder), num_blocks=64).generate(prompts, params)
    llm = _speculating(folder, num_blocks=64)
    spec = llm.generate(prompts, params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    for result in spec[0::2]:
        assert result.finish_reason == "stop"
        jsonschema.validate(json.loads(result.text), schema)
    runner = llm.engine.runner
    assert runner.spec_accepted_tokens > 0 and runner.spec_drafts > 0


def _thinking_model(tiny_model_dir):
    """A tiny model whose tokenizer has two more tokens than the others'."""
    from tiny_models import build_model

    folder = tiny_model_dir("llama").parent.parent / "spec-thinking"
    return folder if folder.exists() else build_model(folder, "llama", thinking=True)


@pytest.mark.parametrize("draft_type", ["llama", "qwen3"])
def test_a_draft_model_gives_plain_decodings_greedy_output(tiny_model_dir, tmp_path, draft_type):
    """The target drafting with itself accepts every draft; another model's drafts are mostly
    rejected; the output is plain decoding's either way, and both pools end empty."""
    from tiny_models import build_model

    folder = tiny_model_dir("llama")
    # Another seed: a qwen3 from the llama's seed has nearly its weights and agrees with it.
    draft = folder if draft_type == "llama" else build_model(tmp_path, draft_type, seed=1)
    plain = _greedy(LLM(str(folder), num_blocks=64))
    llm = LLM(str(folder), num_blocks=64, draft_model=str(draft), num_draft_tokens=3)
    llm.engine.runner.spec_policy.adaptive = False
    assert _greedy(llm) == plain
    runner = llm.engine.runner
    assert runner.spec_drafts > 0
    if draft_type == "llama":
        assert runner.spec_accepted_tokens == runner.spec_draft_tokens
    else:  # mostly rejected
        assert 2 * runner.spec_accepted_tokens < runner.spec_draft_tokens
    for pool in (llm.engine.kv.block_pool, runner.proposer.kv.block_pool):
        assert pool.num_free_blocks == pool.num_usable_blocks


def test_a_draft_models_pool_fits_the_same_budget_and_survives_preemption(tiny_model_dir):
    folder = tiny_model_dir("llama")
    budget = 2**20
    llm = LLM(str(folder), kv_budget_bytes=budget, draft_model=str(tiny_model_dir("qwen3")),
              num_draft_tokens=3)  # fmt: skip
    runner = llm.engine.runner
    draft = runner.proposer.runner
    assert draft.pool.num_blocks == runner.pool.num_blocks
    assert runner.pool.nbytes + draft.pool.nbytes <= budget
    small = LLM(str(folder), num_blocks=14, block_size=16)
    prompts, limits = [p * 2 for p in PROMPTS] * 2, LIMITS * 2
    plain = _greedy(small, prompts, limits)
    llm = LLM(str(folder), num_blocks=14, block_size=16, draft_model=str(folder))
    llm.engine.runner.spec_policy.adaptive = False
    assert _greedy(llm, prompts, limits) == plain
    assert llm.engine.metrics.preemptions_total > 0 and llm.engine.runner.spec_drafts > 0


def test_seeded_rows_do_not_draft(tiny_model_dir):
    """A seed gives one output whatever kind each step was: its rows take no drafts, which
    would change how many draws the output takes."""
    llm = _speculating(tiny_model_dir("llama"), num_blocks=64)
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=3, ignore_eos=True)
    first = llm.generate(PROMPTS[:1], params)[0].token_ids
    assert llm.engine.runner.spec_drafts == 0
    plain = LLM(str(tiny_model_dir("llama")), num_blocks=64)
    assert plain.generate(PROMPTS[:1], params)[0].token_ids == first


def test_a_draft_model_catches_up_on_long_prompts_a_chunk_a_step(tiny_model_dir):
    """With a prefill chunk of 8, no draft forward feeds more than 8 tokens a row: rows behind
    catch up over several steps, then draft; the output stays plain decoding's."""
    folder = tiny_model_dir("llama")
    prompts, limits = [p * 2 for p in PROMPTS], LIMITS
    plain = _greedy(LLM(str(folder), num_blocks=64), prompts, limits)
    llm = LLM(str(folder), num_blocks=64, draft_model=str(folder), num_draft_tokens=3,
              prefill_step_size=8)  # fmt: skip
    llm.engine.runner.spec_policy.adaptive = False
    proposer, widths = llm.engine.runner.proposer, []
    forward = proposer._forward

    def recorded(rows, tokens, starts, counts):
        widths.append(max(counts))
        return forward(rows, tokens, starts, counts)

    proposer._forward = recorded
    assert _greedy(llm, prompts, limits) == plain
    assert max(widths) <= 8 and max(len(p) for p in prompts) > 8
    assert llm.engine.runner.spec_accepted_tokens == llm.engine.runner.spec_draft_tokens > 0
