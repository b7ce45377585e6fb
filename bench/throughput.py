"""Engine throughput, paged and contiguous, against mlx-lm's BatchGenerator: same model, prompts
and lengths, one process.

Each configuration runs `repeats` times after one warm-up; the table reports medians of
generated tokens per second over the whole run (prefill included), so both sides pay the same
work.
"""

from __future__ import annotations

import platform
import statistics
import time

import mlx.core as mx

from mlx_paged.progress import Progress

from .output import write_result

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "What does a compiler do?",
    "How many legs does a spider have?",
    "Give me a tip for learning to cook.",
    "What is photosynthesis?",
    "Describe a cat in one sentence.",
    "What is the boiling point of water?",
    "Suggest a name for a pet fish.",
    "Explain gravity to a child.",
    "What is a prime number?",
    "List two uses of copper.",
    "What language is spoken in Brazil?",
    "How do bees make honey?",
]


def _prompts(tokenizer, n: int) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}], add_generation_prompt=True
        )
        for i in range(n)
    ]


def run_engine(llm, prompts, max_tokens: int) -> tuple[float, int]:
    from mlx_paged import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    tic = time.perf_counter()
    results = llm.generate(prompts, params)
    return time.perf_counter() - tic, sum(len(r.token_ids) for r in results)


def run_batch_generator(model, prompts, max_tokens: int, batch: int) -> tuple[float, int]:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model,
        max_tokens=max_tokens,
        stop_tokens=None,
        completion_batch_size=max(32, batch),
        prefill_batch_size=8,
    )
    tic = time.perf_counter()
    gen.insert(prompts, max_tokens=[max_tokens] * len(prompts))
    count = 0
    while True:
        prompt_responses, responses = gen.next()
        if not prompt_responses and not responses:
            break
        count += len(responses)
    elapsed = time.perf_counter() - tic
    gen.close()
    return elapsed, count


def main(args) -> int:
    from mlx_paged import LLM

    # Prefix caching off: every run repeats the same prompts, and hits would skip their prefill.
    paged = LLM(args.model, enable_prefix_caching=False)
    contiguous = LLM(args.model, kv_paged=False)
    rows = []
    # Per concurrency: a warm-up of each path, then `repeats` timed runs of each.
    bar = Progress("throughput runs", len(args.concurrency) * 3 * (1 + args.repeats), "run")
    for c in args.concurrency:
        prompts = _prompts(paged.tokenizer, c)
        run_engine(paged, prompts, 4)
        run_engine(contiguous, prompts, 4)
        run_batch_generator(contiguous.model, prompts, 4, c)
        bar.update(3)
        runs: dict[str, list[float]] = {"paged": [], "contiguous": [], "batch_generator": []}
        for _ in range(args.repeats):
            for name, (fn, *fn_args) in (
                ("paged", (run_engine, paged, prompts, args.max_tokens)),
                ("contiguous", (run_engine, contiguous, prompts, args.max_tokens)),
                (
                    "batch_generator",
                    (run_batch_generator, contiguous.model, prompts, args.max_tokens, c),
                ),
            ):
                elapsed, n = fn(*fn_args)
                runs[name].append(n / elapsed)
                bar.update()
        row = {"concurrency": c, "max_tokens": args.max_tokens, "runs": runs}
        row.update({f"{name}_tok_s": statistics.median(v) for name, v in runs.items()})
        row["paged_vs_batch_generator"] = row["paged_tok_s"] / row["batch_generator_tok_s"]
        row["contiguous_vs_batch_generator"] = (
            row["contiguous_tok_s"] / row["batch_generator_tok_s"]
        )
        rows.append(row)
        print(
            f"concurrency {c:3d}: paged {row['paged_tok_s']:8.1f}  contiguous "
            f"{row['contiguous_tok_s']:8.1f}  BatchGenerator {row['batch_generator_tok_s']:8.1f}"
            f" tok/s   paged/BG {row['paged_vs_batch_generator']:.2f}",
            flush=True,
        )
    bar.close()
    write_result(
        {"model": paged.model_id, "device": str(mx.default_device()),
         "machine": platform.machine(), "mlx": mx.__version__, "repeats": args.repeats,
         "statistic": "median", "rows": rows},
        args.out,
    )  # fmt: skip
    return 0
