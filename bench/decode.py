"""End-to-end decode throughput at a large batch: paged KV with the generated decode kernel,
paged KV with the reference attention, the contiguous path, and mlx-lm's BatchGenerator.

Decode tokens/s = batch x (new - 1) / (time to generate `new` tokens - time to generate 1),
so every method pays the same prefill and only the decode steps are compared. Median of
`--repeats` runs, after one warm-up run per method of the full length (a shorter one left the
first timed run of the kernel path at a quarter of the later ones' speed on the H200). The
methods take turns, one sample each per round, so a host's drift reaches all of them alike
(every method's engine stays loaded for the whole run); `paired_ratio` is the median over
rounds of a method's tok/s over the first method's.
"""

from __future__ import annotations

import platform
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_paged.progress import Progress, progress

from .output import device_name, write_result
from .report_decode import HOST_PARTS, HOST_SPLIT
from .throughput import run_batch_generator


def _timed_engine(llm, prompts, max_tokens: int) -> float:
    from mlx_paged import SamplingParams

    tic = time.perf_counter()
    results = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    assert all(len(r.token_ids) == max_tokens for r in results)
    return time.perf_counter() - tic


def _interleaved(runs: dict, batch: int, new: int, repeats: int) -> dict:
    """`runs` maps a method to `run(n)`, the seconds to generate n tokens per sequence (each
    warmed up already). Rounds time every method once, in order; returns per method its
    median tok/s, its samples and `paired_ratio` (see the module docstring)."""
    samples: dict[str, list[float]] = {name: [] for name in runs}
    with Progress("timed decode runs", repeats * len(runs), "run") as bar:
        for _ in range(repeats):
            for name, run in runs.items():
                full, first = run(new), run(1)
                samples[name].append(batch * (new - 1) / (full - first))
                bar.update()
    base = samples[next(iter(runs))]
    return {
        name: {
            "decode_tok_s": statistics.median(tok_s),
            "samples": tok_s,
            "paired_ratio": statistics.median(a / b for a, b in zip(tok_s, base)),
        }
        for name, tok_s in samples.items()
    }


def main(args) -> int:
    """Time decode of every method at `args.batch` x `args.prompt`; writes `args.out`."""
    from .random_models import RANDOM_MODELS, build_random_model

    described = RANDOM_MODELS[args.random_model][2]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            print(f"building a {described}...", flush=True)
            model = str(build_random_model(Path(tmp) / args.random_model, args.random_model))
        rng = np.random.default_rng(0)
        prompts = [rng.integers(2, 32000, size=args.prompt).tolist() for _ in range(args.batch)]
        methods = _timed_methods(model, prompts, args)
    base = methods["batch_generator"]["decode_tok_s"]
    for entry in methods.values():
        entry["vs_batch_generator"] = entry["decode_tok_s"] / base
    result = {"model": args.model or described,
              "device": device_name(),
              "mlx": mx.__version__, "machine": platform.machine(), "batch": args.batch,
              "prompt_tokens": args.prompt, "new_tokens": args.new, "repeats": args.repeats,
              "statistic": "median", "paired_base": next(iter(methods)),
              "methods": methods}  # fmt: skip
    write_result(result, args.out)
    return 0


def _timed_methods(model: str, prompts: list, args) -> dict:
    """Every method of `args.methods` and `BatchGenerator`, timed in turns (`_interleaved`),
    with the engines' host/wait split and attention calls."""
    llms, bg_model = _engines(model, prompts, args)
    try:
        runs = {name: partial(_timed_engine, llm, prompts) for name, llm in llms.items()}
        runs["batch_generator"] = lambda n: run_batch_generator(bg_model, prompts, n, args.batch)[0]
        runs["batch_generator"](args.new)  # its warm-up; the engines warmed up as they loaded
        before = {name: _step_counters(llm) for name, llm in llms.items()}
        methods = _interleaved(runs, args.batch, args.new, args.repeats)
        for name, entry in methods.items():
            _print_method(name, entry)
            if name in llms:
                entry.update(_engine_figures(name, llms[name], before[name]))
        return methods
    finally:
        for llm in llms.values():
            llm.engine.shutdown()


def _print_method(name: str, entry: dict) -> None:
    runs = ", ".join(f"{s:.1f}" for s in entry["samples"])
    print(f"{name:16s} {entry['decode_tok_s']:9.1f} decode tok/s, {entry['paired_ratio']:.3f}x "
          f"the first method round by round  (runs: {runs})", flush=True)  # fmt: skip


ENGINE_METHODS = {
    # Compiled steps of the lean step (the default where the fused one does not apply).
    "paged_kernel": dict(paged_attention="kernel", lean_decode="on"),
    "paged_kernel_eager": dict(paged_attention="kernel", compile_decode="off"),
    # mlx-lm's own forward for decode steps, against the lean step.
    "paged_kernel_mlx_lm_forward": dict(paged_attention="kernel", lean_decode="off"),
    # The lean step with the layer kernels (`--lean-decode fused`; the default for llama).
    "paged_kernel_lean_fused": dict(paged_attention="kernel", lean_decode="fused"),
    "paged_kernel_fused_rope": dict(paged_attention="kernel", fused_rope="auto"),
    "paged_kernel_fused_rope_eager": dict(
        paged_attention="kernel", fused_rope="auto", compile_decode="off"
    ),
    "paged_reference": dict(paged_attention="reference"),
    # Quantized pages (K and V bits, groups of 32), read by the dequantizing kernels.
    "paged_kernel_kv8": dict(paged_attention="kernel", kv_bits=8, kv_group_size=32),
    "paged_kernel_kv4": dict(paged_attention="kernel", kv_bits=4, kv_group_size=32),
    "contiguous": dict(kv_paged=False),
}
DEFAULT_METHODS = ("paged_kernel", "paged_reference", "contiguous")


def _engines(model: str, prompts: list, args) -> tuple[dict, object]:
    """An engine, warmed up, for each of the engine's paths in `args.methods`; also a loaded
    model for `BatchGenerator` (the contiguous path's, when it is one of them)."""
    from mlx_paged import LLM

    common = dict(max_num_seqs=args.batch, max_num_prefill_seqs=args.prefill_batch,
                  prefill_step_size=args.prompt, enable_prefix_caching=False)  # fmt: skip
    llms = {}
    names = [m for m in args.methods if m in ENGINE_METHODS]
    for name in progress(names, "loading and warming up the engines", unit="engine"):
        llms[name] = LLM(model, **common, **ENGINE_METHODS[name])
        _timed_engine(llms[name], prompts, args.new)  # warm-up, left out of the host/wait split
    if "contiguous" in llms:
        return llms, llms["contiguous"].model
    from mlx_lm import load

    return llms, load(model)[0]


def _engine_figures(name: str, llm, before: tuple) -> dict:
    """Host and wait ms per step (`_step_split`) and, on the paged paths, attention calls."""
    figures = _step_split(llm, before)
    if name.startswith("paged"):
        calls = llm.engine.runner.pool.attention_calls
        figures["attention_calls"] = {f"{p}/{ph}": n for (p, ph), n in calls.items()}
    return figures


def _step_counters(llm) -> tuple:
    m = llm.engine.metrics
    parts = tuple(getattr(m, f"decode_{part}_seconds_total") for part in HOST_PARTS)
    mixed = (m.mixed_step_seconds_total, m.mixed_steps_total)
    return m.decode_seconds_total, m.decode_wait_seconds_total, *parts, *mixed, m.decode_steps_total


def _step_split(llm, before: tuple) -> dict:
    """Host and device-wait ms per decode step since `before` (`_step_counters`), the host
    part split into graph building, MLX's dispatch, token delivery and the rest: a step waits
    for the device only when its host work took less than the device's. Steps that carried
    prompt chunks (while a batch's prompts enter) are not in it: they are counted apart, with
    their mean ms, since the timed runs' ramps hold them."""
    total, wait, *parts, mixed, num_mixed, steps = (
        a - b for a, b in zip(_step_counters(llm), before)
    )
    host_ms, wait_ms = (total - wait) / steps * 1e3, wait / steps * 1e3
    figures = {"host_ms_per_step": host_ms, "wait_ms_per_step": wait_ms,
               "mixed_steps": num_mixed,
               "mixed_ms_per_step": mixed / num_mixed * 1e3 if num_mixed else 0.0}  # fmt: skip
    parts_ms = {f"{part}_ms_per_step": t / steps * 1e3 for part, t in zip(HOST_PARTS, parts)}
    figures |= parts_ms | {"other_ms_per_step": host_ms - sum(parts_ms.values())}
    split = ", ".join(f"{part} {figures[f'{part}_ms_per_step']:.2f}"
                      for part in HOST_SPLIT)  # fmt: skip
    print(
        f"{'':16s} host {host_ms:.2f} ms/step ({split}), waiting for the device "
        f"{wait_ms:.2f} ms/step; {num_mixed} steps with prompt work, "
        f"{figures['mixed_ms_per_step']:.1f} ms each"
    )
    return figures
