"""Prefill throughput: `--batch` uncached prompts of `--prompt` tokens each, to their first
token, through the paged engine (prefix caching off) and through mlx-lm's BatchGenerator, in
one process on one model.

Prefill tokens/s = batch x prompt / (time until every request has its first token); medians of
`--repeats` after one warm-up each. `--prefill-batch` sets how many prompts prefill at once
(the engine's `max_num_prefill_seqs`, BatchGenerator's `prefill_batch_size`).
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_paged.progress import progress

from .output import device_name, write_result


def _engine_run(llm, prompts) -> float:
    from mlx_paged import SamplingParams

    tic = time.perf_counter()
    llm.generate(prompts, SamplingParams(max_tokens=1, ignore_eos=True))
    return time.perf_counter() - tic


def _batch_generator_run(model, prompts, prefill_batch: int) -> float:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        model,
        max_tokens=1,
        stop_tokens=None,
        completion_batch_size=len(prompts),
        prefill_batch_size=prefill_batch,
    )
    tic = time.perf_counter()
    gen.insert(prompts, max_tokens=[1] * len(prompts))
    while any(gen.next()):
        pass
    elapsed = time.perf_counter() - tic
    gen.close()
    return elapsed


def _tok_s(run, tokens: int, repeats: int) -> dict:
    samples = []
    for i in progress(range(1 + repeats), "    warm-up, then timed runs", unit="run"):
        seconds = run()
        if i:  # the first is the warm-up
            samples.append(tokens / seconds)
    print(f"    {statistics.median(samples):10.0f} prefill tok/s  (runs: "
          f"{', '.join(f'{s:.0f}' for s in samples)})", flush=True)  # fmt: skip
    return {"prefill_tok_s": statistics.median(samples), "runs": samples}


def main(args) -> int:
    """Time prefill of every method; writes `args.out`."""
    from mlx_paged import LLM

    from .random_models import build_random_llama

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_random_llama(Path(tmp) / "llama-1b-random"))
        rng = np.random.default_rng(0)
        prompts = [rng.integers(2, 32000, size=args.prompt).tolist() for _ in range(args.batch)]
        tokens = args.batch * args.prompt
        methods = {}
        for n in args.prefill_batch:
            print(f"paged engine, {n} prompts at once", flush=True)
            llm = LLM(model, max_num_seqs=args.batch, max_num_prefill_seqs=n,
                      prefill_step_size=args.prompt, enable_prefix_caching=False)  # fmt: skip
            methods[f"paged_prefill_batch_{n}"] = _tok_s(
                lambda llm=llm: _engine_run(llm, prompts), tokens, args.repeats
            )
            llm.engine.shutdown()
            del llm
            mx.clear_cache()
        from mlx_lm import load

        bg_model = load(model)[0]  # mlx-lm's own model, untouched by the paged setup
        for n in args.prefill_batch:
            print(f"BatchGenerator, {n} prompts at once", flush=True)
            methods[f"batch_generator_prefill_batch_{n}"] = _tok_s(
                lambda n=n: _batch_generator_run(bg_model, prompts, n), tokens, args.repeats
            )
    result = {"model": args.model or "random llama 1B (bf16)", "machine": platform.machine(),
              "device": device_name(),
              "batch": args.batch, "prompt_tokens": args.prompt, "repeats": args.repeats,
              "statistic": "median", "methods": methods}  # fmt: skip
    write_result(result, args.out)
    return 0
