"""What each forward of a paged step runs: rows start in the decode forward, prefill chunks
ride in it while rows decode, and a model whose logits head cannot be split keeps prefill
forwards of its own; the tokens stay mlx-lm's."""

from __future__ import annotations

import pytest
from test_paged_engine import TEXTS, assert_pool_full, params, reference
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams
from mlx_paged.runner import chunk_rows
from mlx_paged.runner.chunk_rows import MIXED_STEP_MIN_ROWS


def test_rows_start_in_the_decode_forward(tiny_model_dir):
    """A request's last prompt token runs in a decode forward, with the batch: the paged path
    runs no forward of its own to start rows, and the tokens stay mlx-lm's."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=3)  # fmt: skip
    runner = llm.engine.runner
    kinds, forwards, joined = [], [], []
    prefill, decode, join, forward = runner._prefill, runner._decode, runner._join, runner._forward

    def recorded(kind, call, log):
        def wrapped(arg, *rest, **kwargs):
            log.append(kind if kind else arg)
            return call(arg, *rest, **kwargs)

        return wrapped

    runner._prefill = recorded("prefill", prefill, kinds)
    runner._decode = recorded("decode", decode, kinds)
    runner._forward = recorded("forward", forward, forwards)
    runner._join = recorded(None, join, joined)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert len(forwards) == len(kinds)  # every forward is a prefill chunk's or a decode step's
    assert sum(len(rows) for rows in joined) == len(TEXTS)  # each request joined once


def test_prefill_chunks_run_in_the_decode_forward(tiny_model_dir):
    """While rows decode, a step's prefill chunks run inside the decode forward (each chunk
    token a row of its own): a forward of their own runs only when nothing decodes, and the
    tokens stay mlx-lm's, with prompts prefilled in several chunks under a budget."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=3, max_num_batched_tokens=12, prefill_step_size=4)  # fmt: skip
    runner = llm.engine.runner
    calls, decoding_at_prefill = {"mixed": 0, "forward": 0, "other": 0}, []
    mixed, prefill, decode, forward = (
        runner._mixed,
        runner._prefill,
        runner._decode,
        runner._forward,
    )

    def counted(name, call):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            if name == "other" and call is prefill:
                decoding_at_prefill.append(len(runner.decode_rows))
            return call(*args, **kwargs)

        return wrapped

    runner._mixed, runner._forward = counted("mixed", mixed), counted("forward", forward)
    runner._prefill, runner._decode = counted("other", prefill), counted("other", decode)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    # A mixed step runs the model's body alone (its head sees only the decode rows).
    assert calls["mixed"] > 0 and calls["forward"] == calls["other"]
    assert decoding_at_prefill and not any(decoding_at_prefill)
    assert runner.pool.attention_calls["causal_rows", "prefill"] > 0
    assert_pool_full(llm)


def _mixed_forwards(tiny_model_dir, as_rows: bool, read_limit: int | None = None):
    """The engine on a tiny llama with mixed steps bucketed (CUDA's setting, forced here),
    chunks as rows or not, and the scheduler's `chunk_read_limit`; per mixed forward, (its
    rows, whether attention splits them)."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=3, max_num_batched_tokens=12, prefill_step_size=4)  # fmt: skip
    runner = llm.engine.runner
    runner.pool.bucket_mixed_steps, runner.pool.chunks_as_rows = True, as_rows
    llm.engine.scheduler.chunk_read_limit = read_limit
    forwards, caches, mixed = [], runner._caches, runner._mixed
    in_mixed = []

    def recorded_mixed(inputs, prefill):
        in_mixed.append(True)
        try:
            return mixed(inputs, prefill)
        finally:
            in_mixed.pop()

    def recorded(metas, *rest):
        if in_mixed:
            forwards.append((len(metas[0].slot_mapping.slots), metas[0].decode_rows is not None))
        return caches(metas, *rest)

    runner._mixed, runner._caches = recorded_mixed, recorded
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert_pool_full(llm)
    return forwards


def test_bucketed_mixed_steps_pad_decode_rows_to_few_sizes(tiny_model_dir):
    """Where the pool buckets mixed steps, a mixed step's decode rows are padded so that they
    and its chunk tokens come to one of few sizes, at least `MIXED_STEP_MIN_ROWS`; the padding
    rows change no token. A few rows and chunks of at most 12 tokens: always the fewest."""
    forwards = _mixed_forwards(tiny_model_dir, as_rows=False)
    assert forwards and set(forwards) == {(MIXED_STEP_MIN_ROWS, True)}


def test_chunk_tokens_run_as_decode_rows(tiny_model_dir):
    """Where the pool's decode has kernels (forced here on the reference), a mixed step's
    chunk tokens are plain decode rows: attention does not split the forward, and the tokens
    stay mlx-lm's."""
    forwards = _mixed_forwards(tiny_model_dir, as_rows=True)
    assert forwards and set(forwards) == {(MIXED_STEP_MIN_ROWS, False)}


def test_chunks_reading_too_much_as_rows_attend_as_prefill(tiny_model_dir, monkeypatch):
    """Chunks whose rows would read more than `CHUNK_ROW_READS` context tokens a layer keep
    the prefill path (its split attention)."""
    monkeypatch.setattr(chunk_rows, "CHUNK_ROW_READS", 0)
    monkeypatch.setattr("mlx_paged.runner.paged_runner.CHUNK_ROW_READS", 0)
    forwards = _mixed_forwards(tiny_model_dir, as_rows=True)
    assert forwards and all(split for _, split in forwards)


def test_a_prompt_down_to_its_last_token_starts_with_the_decode_batch(tiny_model_dir):
    """A 1-token prompt, and a prompt whose prefix hit leaves only its last token, have no
    chunk to prefill: they join the next decode forward and give mlx-lm's tokens."""
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=64)
    one = llm.tokenizer.encode("hi")[:1]
    nine = (llm.tokenizer.encode(" ".join(TEXTS)) * 3)[:9]  # two full blocks and one token
    params = SamplingParams(max_tokens=6, logit_bias={llm.tokenizer.eos_token_id: -100})
    for _ in range(2):  # the second pass hits the first 8 tokens of `nine`
        results = llm.generate([one, nine], params)
        for prompt, r in zip([one, nine], results):
            assert r.token_ids == reference(llm, prompt, 6)
    assert results[1].num_cached_tokens == 8
    assert_pool_full(llm)


def test_a_model_whose_head_cannot_be_split_prefills_in_forwards_of_its_own(
    tiny_model_dir, monkeypatch
):
    """No split logits head: no mixed step, and chunks run as prefill forwards between decode
    steps, with the same tokens."""
    monkeypatch.setattr("mlx_paged.runner.paged_runner.split_logits_head", lambda model: None)
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=3, max_num_batched_tokens=12, prefill_step_size=4)  # fmt: skip
    runner = llm.engine.runner
    assert not runner.mixes_prefill
    calls = {"mixed": 0, "prefill": 0}
    mixed, prefill = runner._mixed, runner._prefill

    def counted(name, call):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return call(*args, **kwargs)

        return wrapped

    runner._mixed, runner._prefill = counted("mixed", mixed), counted("prefill", prefill)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert calls["mixed"] == 0 and calls["prefill"] > 0
    assert_pool_full(llm)


# Four prompts prefilled 8 tokens at a time while rows decode: several chunks a step.
SEVERAL_CHUNKS = dict(
    kv_paged=True,
    block_size=4,
    num_blocks=200,
    max_num_seqs=6,
    max_num_prefill_seqs=4,
    prefill_step_size=8,
    prefill_chunk_seconds=None,
)


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_chunks_of_several_prompts_attend_in_one_call(tiny_model_dir, model_type):
    """Off CUDA, the chunks of several prompts that ride in one decode forward attend in one
    call over their pages (`kv/chunk_batch.py`), sliding windows included, and the tokens stay
    mlx-lm's."""
    llm = LLM(str(tiny_model_dir(model_type)), **SEVERAL_CHUNKS)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    assert llm.engine.runner.pool.attention_calls["batched_rows", "prefill"] > 0
    assert_pool_full(llm)


def test_chunks_over_quantized_pages_keep_a_call_each(tmp_path):
    """Quantized pages keep a call a chunk: chunks from position 0 attend over their fresh
    K/V there, not over pages rounded to 8 bits."""
    llm = LLM(str(build_model(tmp_path, "llama", head_dim=32)), kv_bits=8, kv_group_size=32,
              **SEVERAL_CHUNKS)  # fmt: skip
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    llm.generate(prompts, params(llm))
    calls = llm.engine.runner.pool.attention_calls
    assert calls["batched_rows", "prefill"] == 0 and calls["causal_rows", "prefill"] > 0


def test_the_scheduler_cuts_chunks_to_what_rides_as_rows(tiny_model_dir, monkeypatch):
    """With the chunk-row reads small, the runner alone splits many mixed steps; the scheduler
    cutting chunks to the same reads (`chunk_read_limit`, set by the engine where chunks ride
    as rows) leaves fewer split, and the tokens stay mlx-lm's."""
    monkeypatch.setattr(chunk_rows, "CHUNK_ROW_READS", 100)
    monkeypatch.setattr("mlx_paged.runner.paged_runner.CHUNK_ROW_READS", 100)
    uncut = _mixed_forwards(tiny_model_dir, as_rows=True)
    cut = _mixed_forwards(tiny_model_dir, as_rows=True, read_limit=100)
    # Where even a step's first chunk cannot ride as rows whole, its step still splits.
    assert sum(split for _, split in cut) < sum(split for _, split in uncut)
