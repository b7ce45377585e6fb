"""Engine behaviour on a tiny random llama: sampling options, stops, cancellation, failures."""

from __future__ import annotations

import pytest

from mlx_paged import LLM, SamplingParams
from mlx_paged.errors import InvalidRequestError


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), kv_paged=False, max_num_seqs=4, max_num_prefill_seqs=2)


def no_eos(llm, **kw):
    return SamplingParams(logit_bias={llm.tokenizer.eos_token_id: -100}, **kw)


def collect(stream):
    ids, text, outs = [], "", []
    for o in stream:
        ids += o.token_ids
        text += o.text
        outs.append(o)
    return ids, text, outs[-1]


def test_generate_returns_one_result_per_prompt(llm):
    results = llm.generate(["hello world", "the quick brown fox"], no_eos(llm, max_tokens=7))
    assert [len(r.token_ids) for r in results] == [7, 7]
    assert all(r.finish_reason == "length" for r in results)
    assert results[0].text == llm.tokenizer.decode(results[0].token_ids)


def test_stop_string_truncates_text_and_finishes(llm):
    full = llm.generate("hello world", no_eos(llm, max_tokens=24))[0]
    assert len(full.text) > 6
    stop = full.text[3:6]
    finished = dict(llm.engine.metrics.finished)
    cut = llm.generate("hello world", no_eos(llm, max_tokens=24, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert full.token_ids[: len(cut.token_ids)] == cut.token_ids
    # The front matched it; the engine ends the request as stopped and frees its row.
    llm.engine.drain_inbox()
    assert not llm.engine.scheduler.has_unfinished_requests()
    after = llm.engine.metrics.finished
    assert sum(after.values()) == sum(finished.values()) + 1
    assert after.get("abort", 0) == finished.get("abort", 0)


def test_eos_stops_and_is_not_emitted(llm):
    eos = llm.tokenizer.eos_token_id
    r = llm.generate("hello", SamplingParams(max_tokens=5, logit_bias={eos: 100}))[0]
    assert (r.token_ids, r.text, r.finish_reason) == ([], "", "stop")
    r = llm.generate("hello", SamplingParams(max_tokens=5, logit_bias={eos: 100}, ignore_eos=True))[
        0
    ]
    assert r.token_ids == [eos] * 5 and r.finish_reason == "length"


def test_logprobs_are_sorted_and_greedy_token_is_the_top(llm):
    r = llm.generate("hello world", no_eos(llm, max_tokens=4, logprobs=True, top_logprobs=3))[0]
    assert len(r.logprobs) == 4
    for token_id, entry in zip(r.token_ids, r.logprobs):
        values = [lp for _, _, lp in entry.top_logprobs]
        assert len(values) == 3 and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0][0] == token_id
        assert entry.logprob == pytest.approx(values[0])
        assert entry.logprob <= 0


def test_in_a_mixed_batch_only_the_row_that_asked_gets_logprobs(llm):
    alone = llm.generate("block table", no_eos(llm, max_tokens=5, logprobs=True))[0]
    mixed = llm.generate(
        ["hello world", "block table", "lazy dog"],
        [no_eos(llm, max_tokens=5), no_eos(llm, max_tokens=5, logprobs=True),
         no_eos(llm, max_tokens=5)],
    )  # fmt: skip
    assert [len(r.logprobs) for r in mixed] == [0, 5, 0]
    assert mixed[1].token_ids == alone.token_ids
    assert [e.logprob for e in mixed[1].logprobs] == pytest.approx(
        [e.logprob for e in alone.logprobs], abs=1e-4
    )


def test_same_seed_same_sample_and_seeded_request_runs_alone(llm):
    engine = llm.engine
    params = lambda seed: no_eos(llm, max_tokens=8, temperature=1.0, seed=seed)  # noqa: E731
    a = engine.add_request(llm.encode("hello world"), no_eos(llm, max_tokens=6))
    s1 = engine.add_request(llm.encode("lazy dog"), params(11))
    b = engine.add_request(llm.encode("block table"), no_eos(llm, max_tokens=6))
    widest_with_seeded = 0
    while engine.scheduler.has_unfinished_requests() or not engine._inbox.empty():
        engine.drain_inbox()
        engine.step()
        active = engine.scheduler.running + engine.scheduler.prefilling
        if s1.request in active:
            widest_with_seeded = max(widest_with_seeded, len(active))
    assert widest_with_seeded == 1
    first = collect(s1)[0]
    again = llm.generate("lazy dog", params(11))[0].token_ids
    other = llm.generate("lazy dog", params(12))[0].token_ids
    assert first == again and first != other
    assert len(collect(a)[0]) == 6 and len(collect(b)[0]) == 6


def test_abort_frees_the_row_and_ends_the_stream(llm):
    engine = llm.engine
    keep = engine.add_request(llm.encode("hello world"), no_eos(llm, max_tokens=12))
    gone = engine.add_request(llm.encode("the quick brown fox"), no_eos(llm, max_tokens=200))
    for _ in range(5):
        engine.drain_inbox()
        engine.step()
    assert len(engine.runner.decode_rows) == 2
    gone.cancel()
    engine.drain_inbox()
    assert [r.request_id for r in engine.runner.decode_rows] == [keep.request_id]
    assert collect(gone)[2].finish_reason == "abort"
    while engine.scheduler.has_unfinished_requests():
        engine.step()
    assert len(collect(keep)[0]) == 12
    assert engine.runner.decode_rows == [] and engine.runner.decode_cache == []


def test_context_limits(llm):
    engine = llm.engine
    n = engine.max_model_len
    with pytest.raises(InvalidRequestError) as info:
        engine.check_request([5] * n, SamplingParams())
    assert info.value.code == "context_length_exceeded" and info.value.param == "messages"
    with pytest.raises(InvalidRequestError) as info:
        engine.check_request([5] * (n - 10), SamplingParams(max_tokens=11))
    assert info.value.param == "max_tokens" and "at most 10" in info.value.message
    clamped = engine.check_request(
        [5] * (n - 10), SamplingParams(max_tokens=500), max_tokens_explicit=False
    )
    assert clamped.max_tokens == 10
    with pytest.raises(InvalidRequestError):
        engine.check_request([], SamplingParams())
    with pytest.raises(InvalidRequestError):
        engine.check_request([10**6], SamplingParams())


@pytest.mark.parametrize("kv_paged", [False, True], ids=["contiguous", "paged"])
def test_first_token_goes_out_at_the_step_that_sampled_it(tiny_model_dir, kv_paged):
    # Not paced: the first step prefills the whole prompt but its last token.
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=kv_paged, num_blocks=64,
              prefill_chunk_seconds=None)  # fmt: skip
    engine = llm.engine
    alone = engine.add_request(llm.encode("hello world again"), no_eos(llm, max_tokens=3))
    engine.drain_inbox()
    engine.step()  # the prompt but its last token
    assert alone.queue.empty()
    engine.step()  # the last prompt token samples the first token: out at once, nothing decodes
    first = alone.queue.get_nowait()
    assert len(first.token_ids) == 1
    # Beside a decoding row, a first token comes with the next step instead (keeping that
    # step's build overlapped with the device), and is never sent twice.
    late = engine.add_request(llm.encode("the quick brown fox"), no_eos(llm, max_tokens=3))
    while engine.scheduler.has_unfinished_requests():
        engine.drain_inbox()
        engine.step()
    expected = llm.generate(["hello world again", "the quick brown fox"], no_eos(llm, max_tokens=3))
    assert first.token_ids + collect(alone)[0] == expected[0].token_ids
    assert collect(late)[0] == expected[1].token_ids
