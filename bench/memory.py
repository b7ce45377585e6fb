"""KV memory density: how many sequences fit a fixed KV budget, and how much allocated KV memory
holds no token, for the paged path, the contiguous (left-padded) path and mlx-lm's
BatchGenerator, on one seeded workload, measured by running each of them.

Workload (seeded): prompt lengths log-normal (median 192 tokens, sigma 0.8, clipped to
[16, 1536]); output lengths uniform in [32, 384]; EOS ignored, so every request produces its
full output. The model is a small random-weight llama, or with `--family qwen3_5` a Qwen3.5-like
hybrid whose sequences also keep recurrent state (`memory_models.py`), built offline. The budget
is `--budget-tokens` of the model's K/V; a hybrid's paged path spends it on pages and state
slots, and every path's used bytes count each live sequence's state.

Paged: the pool is the budget and the scheduler admits and preempts against it, so its
concurrency is measured directly. The contiguous path and BatchGenerator have no KV budget; they
run with a fixed decode batch cap, and the table reports how many of their sequences the budget
holds at the allocation they were measured to need per running sequence.

With `--kv-bits 16 8 4`, the paged path also runs with quantized pages (groups of 64) at the
same budget in bytes, so the sequences they hold are measured the same way.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from mlx_paged.progress import Progress

from .memory_models import (
    CONFIGS,
    KV_GROUP_SIZE,
    build_model,
    kv_bytes_kept,
    kv_bytes_per_token,
    state_bytes_per_sequence,
)


def workload(n: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt_len = min(max(int(rng.lognormvariate(5.26, 0.8)), 16), 1536)
        out.append(([rng.randrange(1, 300) for _ in range(prompt_len)], rng.randint(32, 384)))
    return out


@dataclass
class Trace:
    """Per-step samples of running sequences, allocated and used KV bytes."""

    running: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    used: list[int] = field(default_factory=list)
    # running counts of the steps where requests waited for KV: there the budget binds
    bound: list[int] = field(default_factory=list)

    def add(self, running: int, allocated: int, used: int, waiting: int = 0) -> None:
        if running:
            self.running.append(running)
            self.allocated.append(allocated)
            self.used.append(used)
            if waiting:
                self.bound.append(running)

    def summary(self, budget: int, enforced: bool) -> dict:
        waste = 1 - sum(self.used) / max(sum(self.allocated), 1)
        per_seq = sum(self.allocated) / max(sum(self.running), 1)
        at_budget = statistics.mean(self.bound or self.running) if enforced else budget / per_seq
        return {
            "mean_running": statistics.mean(self.running),
            "peak_running": max(self.running),
            "peak_allocated_bytes": max(self.allocated),
            "waste_fraction": waste,
            "allocated_bytes_per_running_seq": per_seq,
            "sequences_at_budget": at_budget,
            "budget_bound_steps": len(self.bound),
            "budget_enforced": enforced,
            "steps": len(self.running),
        }


def run_paged(
    model_dir,
    jobs,
    budget,
    block_size,
    kv_bits: int = 16,
    family="llama",
    state_bytes=0,
    kv_groups: bool = True,
) -> Trace:
    """The paged path on `budget` bytes: all pages on an attention-only model; pages and
    state slots (at most half) on a hybrid, whose sequences also hold `state_bytes` each.
    `kv_groups=False` keeps sliding-window layers' pages in the full-attention group."""
    from mlx_paged import LLM, SamplingParams

    block_bytes = block_size * kv_bytes_per_token(family, kv_bits)
    # Else the engine sizes its own blocks (state slots, groups).
    exact = family in ("llama", "deepseek_v3")
    pool_size = (
        dict(num_blocks=budget // block_bytes + 1) if exact else dict(kv_budget_bytes=budget)
    )
    llm = LLM(
        str(model_dir),
        kv_paged=True,
        block_size=block_size,
        **pool_size,
        max_num_seqs=256,
        max_num_prefill_seqs=8,
        kv_bits=kv_bits,
        kv_group_size=KV_GROUP_SIZE,
        kv_groups=kv_groups,
    )
    engine, trace = llm.engine, Trace()
    for prompt, n in jobs:
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    engine.drain_inbox()
    pool = engine.kv.block_pool
    block_bytes = engine.runner.pool.nbytes // engine.runner.pool.num_blocks
    name = f"paged path, {kv_bits}-bit pages" + ("" if kv_groups else ", one KV cache group")
    for _ in _steps(engine, jobs, name):
        live = engine.scheduler.running + engine.scheduler.prefilling
        used = sum(kv_bytes_kept(family, r.num_computed_tokens, kv_bits) for r in live)
        # Live requests' state slots; snapshots are cache, like free blocks that keep a hash.
        states = len(live) * state_bytes
        trace.add(
            len(engine.scheduler.running),
            (pool.num_usable_blocks - pool.num_free_blocks) * block_bytes + states,
            used + states,
            len(engine.scheduler.waiting),
        )
    return trace


def run_contiguous(model_dir, jobs, cap, family, state_bytes=0) -> Trace:
    from mlx_paged import LLM, SamplingParams

    llm = LLM(str(model_dir), kv_paged=False, max_num_seqs=cap, max_num_prefill_seqs=min(cap, 8))
    engine, trace = llm.engine, Trace()
    for prompt, n in jobs:
        engine.add_request(prompt, SamplingParams(max_tokens=n, ignore_eos=True))
    engine.drain_inbox()
    for _ in _steps(engine, jobs, "contiguous path"):
        live = engine.scheduler.running + engine.scheduler.prefilling
        used = sum(kv_bytes_kept(family, r.num_computed_tokens + len(r.output_token_ids))
                   for r in live)  # fmt: skip
        used += len(live) * state_bytes
        trace.add(len(engine.scheduler.running), engine.runner.kv_bytes_in_use, used)
    return trace


def run_batch_generator(model_dir, jobs, cap, family, state_bytes=0) -> Trace:
    from mlx_lm import load
    from mlx_lm.generate import BatchGenerator

    model, _ = load(str(model_dir))
    gen = BatchGenerator(
        model,
        max_tokens=512,
        stop_tokens=None,
        completion_batch_size=cap,
        prefill_batch_size=min(cap, 8),
    )
    gen.insert([p for p, _ in jobs], max_tokens=[n for _, n in jobs])
    trace = Trace()
    bar = Progress("mlx-lm BatchGenerator", sum(n for _, n in jobs), "tok")
    while True:
        prompt_responses, responses = gen.next()
        if not prompt_responses and not responses:
            break
        bar.update(len(responses))
        batches = (gen._generation_batch, gen._prompt_batch)
        used = sum(kv_bytes_kept(family, len(t)) for b in batches for t in b.tokens)
        used += sum(len(b.tokens) for b in batches) * state_bytes
        trace.add(len(gen._generation_batch), gen.prompt_cache_nbytes, used)
    gen.close()
    bar.close()
    return trace


def _steps(engine, jobs, desc: str):
    """Step `engine` until its requests are done, yielding after each step, with progress in
    tokens computed (prompt and generated)."""
    m = engine.metrics
    with Progress(desc, sum(len(p) + n for p, n in jobs), "tok") as bar:
        while engine.scheduler.has_unfinished_requests():
            before = m.prompt_tokens_total + m.generation_tokens_total
            engine.step()
            bar.update(m.prompt_tokens_total + m.generation_tokens_total - before)
            yield


def _print_results(results: dict, args, budget: int) -> None:
    print(
        f"KV budget {budget / 2**20:.1f} MiB ({args.budget_tokens} tokens), {args.requests} "
        f"requests, seed {args.seed}, block size {args.block_size}, cap {args.cap}"
    )
    print(
        f"{'path':24s} {'seqs at budget':>15s} {'mean running':>13s} {'peak running':>13s} "
        f"{'KV waste':>9s}"
    )
    for name, r in results.items():
        print(
            f"{name:24s} {r['sequences_at_budget']:15.1f} {r['mean_running']:13.1f} "
            f"{r['peak_running']:13d} {100 * r['waste_fraction']:8.1f}%"
        )
    base = results["paged"]["sequences_at_budget"]
    for bits in args.kv_bits:
        if bits != 16:
            seqs = results[f"paged_kv{bits}"]["sequences_at_budget"]
            print(f"{bits}-bit pages: {seqs / base:.2f}x the sequences of 16-bit pages")


def main(args) -> int:
    family = args.family
    bytes_per_token = kv_bytes_per_token(family)
    budget = args.budget_tokens * bytes_per_token
    jobs = workload(args.requests, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp), family)
        state = state_bytes_per_sequence(model_dir)
        results = {
            ("paged" if bits == 16 else f"paged_kv{bits}"): run_paged(
                model_dir, jobs, budget, args.block_size, bits, family, state
            ).summary(budget, True)
            for bits in sorted(set(args.kv_bits) | {16}, reverse=True)
        }
        if CONFIGS[family].get("sliding_window"):  # against windows that keep their pages
            results["paged_one_group"] = run_paged(
                model_dir, jobs, budget, args.block_size, 16, family, state, kv_groups=False
            ).summary(budget, True)
        results["contiguous"] = run_contiguous(model_dir, jobs, args.cap, family, state).summary(
            budget, False
        )
        results["mlx_lm_batch_generator"] = run_batch_generator(
            model_dir, jobs, args.cap, family, state
        ).summary(budget, False)
    _print_results(results, args, budget)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "budget_bytes": budget,
                "budget_tokens": args.budget_tokens,
                "requests": args.requests,
                "seed": args.seed,
                "block_size": args.block_size,
                "cap": args.cap,
                "kv_group_size": KV_GROUP_SIZE,
                "workload": "prompt ~ lognormal(median 192, sigma 0.8) in [16, 1536]; "
                "output ~ uniform[32, 384]; EOS ignored",
                "model": CONFIGS[family],
                "state_bytes_per_sequence": state,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {out}")
    return 0
