"""One request's failure stays its own: refused sampling, a throwing row, failed steps retried,
and MLX's sampling state usable afterwards. Both KV paths, on a tiny random llama."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from mlx_paged import LLM, SamplingParams
from mlx_paged.kv.page_arrays import make_slot_mapping


@pytest.fixture(scope="module", params=["paged", "contiguous"])
def llm(request, tiny_model_dir):
    return LLM(
        str(tiny_model_dir("llama")),
        kv_paged=request.param == "paged",
        max_num_seqs=4,
        max_num_prefill_seqs=2,
        num_blocks=64,
    )


def params(llm, **kw):
    return SamplingParams(logit_bias={llm.tokenizer.eos_token_id: -100}, **kw)


def run(engine, streams):
    """Step until every stream finished; the outputs of each, in order."""
    outs = {s.request_id: [] for s in streams}
    while any(not o or not o[-1].finished for o in outs.values()):
        engine.drain_inbox()
        if engine.scheduler.has_unfinished_requests():
            engine.step()
        for s in streams:
            while not s.queue.empty():
                outs[s.request_id].append(s.queue.get())
    return [outs[s.request_id] for s in streams]


def tokens(outs):
    return [t for o in outs for t in o.token_ids]


def unchecked(p: SamplingParams, **changes) -> SamplingParams:
    """Parameters the validator would refuse, as a caller that skips it would pass them."""
    p = dataclasses.replace(p)
    for name, value in changes.items():
        object.__setattr__(p, name, value)
    return p


def test_poison_sampling_is_refused_alone_and_sampling_still_works(llm):
    engine = llm.engine
    prompt = llm.encode("hello world")
    want = llm.generate("hello world", params(llm, max_tokens=6))[0].token_ids
    good = engine.add_request(prompt, params(llm, max_tokens=6))
    poison = engine.add_request(
        prompt, unchecked(params(llm, max_tokens=6, temperature=1.0), top_k=10**6)
    )
    sampled = engine.add_request(prompt, params(llm, max_tokens=6, temperature=1.0, top_k=5))
    good_outs, poison_outs, sampled_outs = run(engine, [good, poison, sampled])
    assert poison_outs[-1].finish_reason == "error" and "top_k" in poison_outs[-1].error
    assert tokens(good_outs) == want and good_outs[-1].finish_reason == "length"
    assert sampled_outs[-1].finish_reason == "length" and len(tokens(sampled_outs)) == 6
    mx.eval(mx.random.uniform(shape=(2,)))  # the global random state is intact


def test_a_row_whose_sampler_throws_in_a_step_fails_alone(llm):
    engine = llm.engine
    prompt = llm.encode("the quick brown fox")
    want = llm.generate("the quick brown fox", params(llm, max_tokens=8))[0].token_ids
    victim = engine.add_request(prompt, params(llm, max_tokens=8, repetition_penalty=1.1))
    others = [engine.add_request(prompt, params(llm, max_tokens=8)) for _ in range(2)]
    for _ in range(4):  # all three decoding
        engine.drain_inbox()
        engine.step()
    row = victim.request.runtime.sampling
    victim.request.runtime.sampling = dataclasses.replace(
        row, processors=(lambda context, logits: logits.reshape(7, -1),)
    )  # 7 does not divide the vocabulary
    outs = run(engine, [victim, *others])
    assert outs[0][-1].finish_reason == "error" and "sampling failed" in outs[0][-1].error
    for other in outs[1:]:
        assert tokens(other) == want and other[-1].finish_reason == "length"
    assert engine.failed_steps_in_a_row == 0


def test_a_failed_step_is_retried_and_greedy_tokens_do_not_change(llm, monkeypatch):
    engine = llm.engine
    prompts = [llm.encode("hello world"), llm.encode("paged attention kv cache")]
    want = [r.token_ids for r in llm.generate(prompts, params(llm, max_tokens=10))]
    streams = [engine.add_request(p, params(llm, max_tokens=10)) for p in prompts]
    for _ in range(4):
        engine.drain_inbox()
        engine.step()
    real_decode = engine.runner.decode

    def fail_once(rows):
        monkeypatch.setattr(engine.runner, "decode", real_decode)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(engine.runner, "decode", fail_once)
    outs = run(engine, streams)
    assert [tokens(o) for o in outs] == want
    assert engine.last_step_error == "RuntimeError: injected failure"
    assert engine.failed_steps_in_a_row == 0


def test_requests_in_steps_that_keep_failing_fail_and_the_engine_reports_it(llm, monkeypatch):
    engine = llm.engine
    stream = engine.add_request(llm.encode("hello world"), params(llm, max_tokens=10))
    for _ in range(3):
        engine.drain_inbox()
        engine.step()

    def broken(*args):
        raise RuntimeError("device lost")

    monkeypatch.setattr(engine.runner, "decode", broken)
    monkeypatch.setattr(engine.runner, "run_prompts", broken)
    outs = run(engine, [stream])
    assert outs[-1][-1].finish_reason == "error" and "device lost" in outs[-1][-1].error
    assert engine.failed_steps_in_a_row == 2
    later = engine.add_request(llm.encode("hello"), params(llm, max_tokens=3))
    assert run(engine, [later])[0][-1].finish_reason == "error"
    healthy, why = engine.health()
    assert engine.failed_steps_in_a_row == 4 and not healthy and "device lost" in why
    monkeypatch.undo()
    assert llm.generate("hello world", params(llm, max_tokens=3))[0].finish_reason == "length"
    assert engine.failed_steps_in_a_row == 0 and engine.health() == (False, "engine stopped")


def broken_array() -> mx.array:
    """An array whose evaluation throws: drawn from the random state a failed compiled sampler
    trace left behind (the state the engine resets)."""
    from mlx_lm.sample_utils import make_sampler

    with pytest.raises(ValueError):
        make_sampler(temp=1.0, top_k=100)(mx.zeros((1, 10)))
    return mx.random.uniform(shape=(1, 2, 1, 4))


def test_pool_pages_whose_write_failed_are_zeroed_and_the_prefix_cache_dropped(llm):
    if llm.engine.kv is None:
        pytest.skip("paged path only")
    from mlx_paged.engine.fault_isolation import reset_sampling_state

    runner, block_pool = llm.engine.runner, llm.engine.kv.block_pool
    llm.generate("hello world " * 20, params(llm, max_tokens=2))
    assert block_pool.num_cached_free_blocks > 0
    bad = broken_array()
    pool = runner.pool
    layer_shape = (1, pool.page_shape[2], 1, pool.page_shape[3])
    slots = make_slot_mapping([17 * pool.block_size])
    pool.write(0, mx.broadcast_to(bad[..., :1], layer_shape), mx.zeros(layer_shape), slots)
    with pytest.raises(RuntimeError):
        mx.eval(pool.pages)
    reset_sampling_state()
    runner.reset()
    mx.eval(pool.pages)
    assert not any(p.k.any().item() or p.v.any().item() for p in pool.pages)
    assert block_pool.num_cached_free_blocks == 0
    assert llm.generate("hello world", params(llm, max_tokens=3))[0].finish_reason == "length"
