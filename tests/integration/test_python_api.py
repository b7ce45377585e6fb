"""The Python API on a tiny random llama: `LLM.chat` and `LLM.stream` give `generate`'s tokens,
leaving a stream early frees its blocks, and `AsyncLLM` serves coroutines from its own engine
process."""

from __future__ import annotations

import asyncio

import pytest

from mlx_paged import LLM, AsyncLLM, GenerationError, SamplingParams
from mlx_paged.engine.chat_prompt import chat_messages, render_chat
from mlx_paged.errors import InvalidRequestError

HELLO = [{"role": "user", "content": "hello there"}]
QUIZ = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "two plus two"}]


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return LLM(str(tiny_model_dir("llama")), block_size=4, num_blocks=64, max_num_seqs=4)


def no_eos(tokenizer, n: int) -> SamplingParams:
    return SamplingParams(max_tokens=n, logit_bias={tokenizer.eos_token_id: -100})


def test_chat_renders_the_template_and_answers_like_generate(llm):
    params = no_eos(llm.tokenizer, 6)
    ids = [render_chat(llm.tokenizer, chat_messages(c)) for c in (HELLO, QUIZ)]
    want = [r.token_ids for r in llm.generate(ids, params)]
    got = llm.chat([HELLO, QUIZ], params)
    assert [r.token_ids for r in got] == want
    assert [r.prompt_token_ids for r in got] == ids
    [one] = llm.chat(HELLO, params)  # one conversation, not a list of them
    assert one.token_ids == want[0] and one.finish_reason == "length"


def test_chat_refuses_bad_messages_by_name(llm):
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].role"):
        llm.chat([{"role": "wizard", "content": "x"}])


def test_stream_yields_the_tokens_of_generate_then_the_result(llm):
    params = no_eos(llm.tokenizer, 7)
    want = llm.generate("the quick brown fox", params)[0]
    deltas = list(llm.stream("the quick brown fox", params))
    assert [d.finished for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert sum((d.token_ids for d in deltas), []) == want.token_ids
    assert "".join(d.text for d in deltas) == want.text
    final = deltas[-1].result
    assert final.token_ids == want.token_ids and final.finish_reason == "length"
    chat = list(llm.stream(HELLO, params))[-1].result  # a conversation goes through the template
    assert chat.prompt_token_ids == render_chat(llm.tokenizer, chat_messages(HELLO))


def test_leaving_a_stream_early_cancels_it_and_frees_its_blocks(llm):
    pool = llm.engine.kv.block_pool
    free = pool.num_free_blocks
    stream = llm.stream("hello world", no_eos(llm.tokenizer, 50))
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    assert not llm.engine.scheduler.has_unfinished_requests()
    assert pool.num_free_blocks == free
    assert llm.engine.metrics.finished.get("abort", 0) >= 1


def test_async_llm_serves_concurrent_coroutines_and_cancels_a_left_stream(tiny_model_dir, llm):
    params = no_eos(llm.tokenizer, 5)
    want = [r.token_ids for r in llm.generate(["hello world", "the quick brown fox"], params)]
    want_chat = llm.chat(QUIZ, params)[0].token_ids

    async def main():
        engine = AsyncLLM(str(tiny_model_dir("llama")), block_size=4, num_blocks=64)
        async with engine:
            got = await asyncio.gather(
                engine.generate("hello world", params),
                engine.generate("the quick brown fox", params),
                engine.chat(QUIZ, params),
            )
            deltas = []
            async for delta in engine.stream("hello world", no_eos(llm.tokenizer, 40)):
                deltas.append(delta)
                if len(deltas) == 2:
                    break
            with pytest.raises(InvalidRequestError, match="max_tokens"):
                await engine.generate("hi", SamplingParams(max_tokens=10**7))
            for _ in range(100):  # the abort reaches the engine process between its steps
                metrics = await asyncio.to_thread(engine._client.metrics_text)
                if 'finished_total{reason="abort"} 1' in metrics:
                    break
                await asyncio.sleep(0.05)
        return got, deltas, metrics

    got, deltas, metrics = asyncio.run(main())
    assert [r.token_ids for r in got[:2]] == want and got[2].token_ids == want_chat
    assert len(deltas) == 2 and not deltas[-1].finished
    assert 'mlx_paged_requests_finished_total{reason="abort"} 1' in metrics


def test_async_llm_refuses_calls_before_it_starts():
    async def main():
        async for _ in AsyncLLM().stream("hi"):
            pass

    with pytest.raises(RuntimeError, match="not running"):
        asyncio.run(main())


def test_a_failed_request_raises_generation_error():
    from mlx_paged.engine.completion import ResultBuilder
    from mlx_paged.engine.outputs import RequestOutput

    builder = ResultBuilder("r", [1, 2])
    with pytest.raises(GenerationError, match="engine failure"):
        builder.add(RequestOutput("r", finish_reason="error", error="engine failure: boom"))
