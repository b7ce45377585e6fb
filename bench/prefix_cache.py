"""Time to first token for a request behind a long, repeated system prompt: cold (the prefix
cache emptied first) against warm (the same system prompt was served just before), on the
paged path, median of `repeats` runs each."""

from __future__ import annotations

import statistics
import time

from mlx_paged.progress import progress

from .output import write_result

SYSTEM = (
    "You are a meticulous assistant for a public library. Follow the rules below. "
    "Answer briefly and politely. Never invent book titles. When unsure, say so. "
    "Prefer plain words over jargon. Mention opening hours only when asked. "
)


def ttft(engine, prompt: list[int]) -> float:
    from mlx_paged import SamplingParams

    tic = time.perf_counter()
    stream = engine.add_request(prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    engine.drain_inbox()
    first = None
    while engine.scheduler.has_unfinished_requests():
        engine.step()
        if first is None and not stream.queue.empty():
            first = time.perf_counter() - tic
    return first


def main(args) -> int:
    from mlx_paged import LLM

    llm = LLM(args.model, kv_paged=True, block_size=args.block_size)
    tok = llm.tokenizer
    system = SYSTEM * max(1, args.system_tokens // len(tok.encode(SYSTEM)))
    questions = [f"Question {i}: what is a good book about rivers?" for i in range(args.repeats)]

    def prompt(q: str) -> list[int]:
        return tok.apply_chat_template(
            [{"role": "system", "content": system}, {"role": "user", "content": q}],
            add_generation_prompt=True,
        )

    ttft(llm.engine, prompt("warm-up"))
    cold, warm, hits = [], [], []
    for q in progress(questions, "cold and warm time to first token", unit="pair"):
        llm.engine.kv.block_pool.reset_prefix_cache()
        cold.append(ttft(llm.engine, prompt(q)))
        before = llm.engine.metrics.prefix_cache_hit_tokens_total
        warm.append(ttft(llm.engine, prompt(q + " Please.")))
        hits.append(llm.engine.metrics.prefix_cache_hit_tokens_total - before)
    row = {
        "model": llm.model_id,
        "prompt_tokens": len(prompt(questions[0])),
        "cached_tokens_warm": statistics.median(hits),
        "cold_ttft_s": statistics.median(cold),
        "warm_ttft_s": statistics.median(warm),
        "cold_runs": cold,
        "warm_runs": warm,
        "repeats": args.repeats,
        "block_size": args.block_size,
    }
    row["speedup"] = row["cold_ttft_s"] / row["warm_ttft_s"]
    print(
        f"{row['prompt_tokens']} prompt tokens ({row['cached_tokens_warm']:.0f} cached when "
        f"warm): TTFT cold {row['cold_ttft_s']:.3f} s, warm {row['warm_ttft_s']:.3f} s, "
        f"{row['speedup']:.1f}x"
    )
    write_result(row, args.out)
    return 0
