"""`--kv-paged off` equals mlx-lm's BatchGenerator token for token, with requests joining and
leaving mid-batch, on tiny random llama / qwen3 / gemma3_text models and on SmolLM2."""

from __future__ import annotations

import pytest
from mlx_lm.generate import BatchGenerator
from mlx_lm.sample_utils import make_logits_processors

from mlx_paged import LLM, SamplingParams

TEXTS = [
    "hi",
    "the quick brown fox",
    "paged attention kv cache block table and more",
    "hello world hello world hello",
    "continuous batching joins and leaves every step",
    "lazy dog",
    "block table",
    "the quick brown fox jumps over the lazy dog twice over",
]
# (step at which the request arrives, max_tokens): arrivals and exits interleave.
SCHEDULE = [(0, 6), (0, 14), (0, 9), (2, 20), (3, 5), (7, 11), (7, 3), (12, 8)]


def run_batch_generator(model, prompts, schedule, eos, **sizes):
    gen = BatchGenerator(
        model,
        max_tokens=64,
        stop_tokens=[[eos]],
        logits_processors=make_logits_processors(logit_bias={eos: -100}),
        completion_batch_size=sizes["max_num_seqs"],
        prefill_batch_size=sizes["max_num_prefill_seqs"],
        prefill_step_size=sizes["prefill_step_size"],
    )
    tokens, uid_of, step = {}, {}, 0
    while True:
        for i, (arrival, max_tokens) in enumerate(schedule):
            if arrival == step:
                uid_of[i] = gen.insert([prompts[i]], max_tokens=[max_tokens])[0]
                tokens[uid_of[i]] = []
        prompt_responses, responses = gen.next()
        step += 1
        for r in responses:
            tokens[r.uid].append(r.token)
        if step > max(a for a, _ in schedule) and not prompt_responses and not responses:
            break
    gen.close()
    return [tokens[uid_of[i]] for i in range(len(prompts))]


def run_engine(llm, prompts, schedule, eos):
    engine = llm.engine
    streams, step = {}, 0
    while True:
        for i, (arrival, max_tokens) in enumerate(schedule):
            if arrival == step:
                params = SamplingParams(max_tokens=max_tokens, logit_bias={eos: -100})
                streams[i] = engine.add_request(prompts[i], params)
        engine.drain_inbox()
        engine.step()
        step += 1
        if step > max(a for a, _ in schedule) and not engine.scheduler.has_unfinished_requests():
            break
    out = []
    for i in range(len(prompts)):
        ids = []
        for o in streams[i]:
            ids += o.token_ids
        out.append(ids)
    return out


SIZES = dict(max_num_seqs=4, max_num_prefill_seqs=2, prefill_step_size=8)


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_tiny_models_match_batch_generator(tiny_model_dir, model_type):
    llm = LLM(str(tiny_model_dir(model_type)), kv_paged=False, **SIZES)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    eos = llm.tokenizer.eos_token_id
    ours = run_engine(llm, prompts, SCHEDULE, eos)
    theirs = run_batch_generator(llm.model, prompts, SCHEDULE, eos, **SIZES)
    assert [len(t) for t in ours] == [m for _, m in SCHEDULE]
    assert ours == theirs


def test_smollm2_matches_batch_generator(smollm2_dir):
    sizes = dict(max_num_seqs=3, max_num_prefill_seqs=2, prefill_step_size=16)
    llm = LLM(str(smollm2_dir), kv_paged=False, **sizes)
    # One chat-templated prompt (37 tokens, its system prompt included) and three short plain
    # ones: prompts of different lengths share the batch, at a quarter of the prefill cost.
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    prompts = [llm.tokenizer.apply_chat_template(chat, add_generation_prompt=True)] + [
        llm.tokenizer.encode(t) for t in ("Primary colors are", "Birds sing because", "2 + 2 =")
    ]
    schedule = [(0, 12), (0, 6), (1, 10), (4, 8)]
    eos = llm.tokenizer.eos_token_id
    ours = run_engine(llm, prompts, schedule, eos)
    theirs = run_batch_generator(llm.model, prompts, schedule, eos, **sizes)
    assert ours == theirs
    assert llm.tokenizer.decode(ours[0]).startswith("The capital of France is Paris.")
