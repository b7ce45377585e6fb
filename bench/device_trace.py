"""Where a decode step's time goes on CUDA: the device's busy time per step, its idle gaps, its
kernels, and the host's CUDA API calls, from a CUPTI trace of the engine's decode steps.

PyTorch's profiler records CUPTI activity for the whole process, so it sees MLX's kernels and
CUDA calls too. The engine runs the prompts twice with prefix caching on, then is traced on a
third run: its prompts are cached, and the window after the last prefill attention kernel
(cuDNN's SDPA) holds decode steps only. Steps are counted by their sampling kernel (argmax).
Needs PyTorch with CUDA beside MLX's CUDA backend.
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .output import device_name, write_result

# Kernels that mark the end of prompt work (prefill attention), and one sampling kernel a step.
PREFILL_MARK = "sdpa"
STEP_MARK = "ArgMax"
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATEGORIES = ("cuda_runtime", "cuda_driver")
# Idle gaps are reported in these bands (µs).
GAP_BANDS = ((0, 5), (5, 20), (20, 100), (100, 500), (500, float("inf")))


def decode_window(events: list[dict]) -> list[dict]:
    """The events that start after the last prefill attention kernel (all, if none ran)."""
    ends = [e["ts"] + e["dur"] for e in events
            if e.get("cat") == "kernel" and PREFILL_MARK in e.get("name", "")]  # fmt: skip
    start = max(ends, default=float("-inf"))
    return [e for e in events if "ts" in e and e["ts"] > start]


def busy_and_gaps(intervals: list[tuple[float, float]]) -> tuple[float, list[float]]:
    """The union's length of `(start, end)` intervals, and the gaps between its pieces."""
    if not intervals:
        return 0.0, []
    intervals = sorted(intervals)
    busy, gaps = 0.0, []
    start, end = intervals[0]
    for s, e in intervals[1:]:
        if s > end:
            busy += end - start
            gaps.append(s - end)
            start, end = s, e
        else:
            end = max(end, e)
    return busy + end - start, gaps


def tally(events: list[dict], categories: tuple[str, ...]) -> dict[str, tuple[int, float]]:
    """Per name, (count, total µs) of the `categories` events, largest total first."""
    totals: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") in categories and "dur" in e:
            totals[e["name"]][0] += 1
            totals[e["name"]][1] += e["dur"]
    return {k: (n, t) for k, (n, t) in sorted(totals.items(), key=lambda kv: -kv[1][1])}


def summarize(events: list[dict], top: int = 20) -> dict:
    """Per-step figures of the decode window of a trace's `events` (times in ms)."""
    window = decode_window(events)
    device = [e for e in window if e.get("cat") in DEVICE_CATEGORIES and "dur" in e]
    steps = sum(1 for e in device if STEP_MARK in e["name"])
    if not device or not steps:
        raise ValueError("the trace has no decode steps on the device (no sampling kernels)")
    busy, gaps = busy_and_gaps([(e["ts"], e["ts"] + e["dur"]) for e in device])
    span = max(e["ts"] + e["dur"] for e in device) - min(e["ts"] for e in device)
    gaps = np.asarray(gaps)
    per_step = lambda us: us / steps / 1e3  # noqa: E731
    bands = {f"{lo}-{hi} us": per_step(float(gaps[(gaps >= lo) & (gaps < hi)].sum()))
             for lo, hi in GAP_BANDS}  # fmt: skip
    kernels = tally(device, DEVICE_CATEGORIES)
    calls = tally(window, API_CATEGORIES)
    return {
        "steps": steps,
        "device_activities_per_step": len(device) / steps,
        "busy_ms_per_step": per_step(busy),
        "span_ms_per_step": per_step(span),
        "idle_ms_per_step_by_gap": bands,
        "kernels": [
            {"name": k, "count": n, "ms_per_step": per_step(t), "us_each": t / n}
            for k, (n, t) in list(kernels.items())[:top]
        ],  # fmt: skip
        "cuda_calls": [
            {"name": k, "count": n, "ms_per_step": per_step(t)}
            for k, (n, t) in list(calls.items())[:top]
        ],  # fmt: skip
    }


def format_summary(s: dict) -> str:
    """`summarize`'s figures as a few lines of text."""
    lines = [
        f"decode window: {s['steps']} steps, {s['device_activities_per_step']:.0f} device "
        f"activities a step; device busy {s['busy_ms_per_step']:.3f} ms of "
        f"{s['span_ms_per_step']:.3f} ms a step",
        "idle ms a step, by gap: "
        + ", ".join(f"{band} {ms:.3f}" for band, ms in s["idle_ms_per_step_by_gap"].items()),
        "kernels (count, ms a step, µs each):",
    ]
    lines += [f"  {k['count']:7d} {k['ms_per_step']:7.3f} {k['us_each']:8.1f}  {k['name'][:80]}"
              for k in s["kernels"]]  # fmt: skip
    lines.append("host CUDA calls (count, ms a step):")
    lines += [f"  {c['count']:7d} {c['ms_per_step']:7.3f}  {c['name']}" for c in s["cuda_calls"]]
    return "\n".join(lines)


def _traced_run(llm, prompts: list, new: int) -> tuple[list[dict], dict]:
    """The trace events of one `llm.generate`, and the engine's host split per decode step
    with the run's seconds."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from .decode import _step_counters, _step_split, _timed_engine

    torch.cuda.init()
    before = _step_counters(llm)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds = _timed_engine(llm, prompts, new)
    engine = _step_split(llm, before) | {"traced_seconds": seconds}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        events = json.loads(Path(path).read_text())["traceEvents"]
    return events, engine


def main(args) -> int:
    """Trace the default engine's decode steps at `args.batch` x `args.prompt`; writes
    `args.out`."""
    import mlx.core as mx

    from mlx_paged import LLM

    from .decode import _timed_engine
    from .random_models import RANDOM_MODELS, build_random_model

    if not mx.cuda.is_available():
        raise SystemExit("bench trace needs MLX's CUDA backend (and PyTorch with CUDA)")
    rng = np.random.default_rng(0)
    prompts = [rng.integers(2, 32000, size=args.prompt).tolist() for _ in range(args.batch)]
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(build_random_model(Path(tmp) / "llama-1b", "llama-1b"))
        llm = LLM(model, max_num_seqs=args.batch, max_num_prefill_seqs=args.prefill_batch,
                  prefill_step_size=args.prompt, enable_prefix_caching=True)  # fmt: skip
        try:
            for _ in range(2):  # warm-up, which also caches the prompts
                _timed_engine(llm, prompts, args.new)
            events, engine = _traced_run(llm, prompts, args.new)
        finally:
            llm.engine.shutdown()
    summary = summarize(events)
    print(format_summary(summary))
    result = {"model": args.model or RANDOM_MODELS["llama-1b"][2], "device": device_name(),
              "mlx": mx.__version__, "batch": args.batch, "prompt_tokens": args.prompt,
              "new_tokens": args.new, "engine": engine,
              "decode_window": summary}  # fmt: skip
    write_result(result, args.out)
    return 0
