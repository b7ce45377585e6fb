"""The flags of `mlx-paged bench trace`: a CUPTI trace of the engine's decode steps (CUDA)."""

from __future__ import annotations

import argparse


def add_trace_bench(sub: argparse._SubParsersAction, run) -> None:
    """Add `bench trace` (run by `run`): the batch it traces and where it writes."""
    p = sub.add_parser(
        "trace",
        help="where a decode step's time goes on CUDA: device busy and idle per step, kernels, "
        "host CUDA calls (needs PyTorch's profiler)",
    )
    p.add_argument("--model", default=None, help="model (default: a random llama 1B)")
    p.add_argument("--batch", type=int, default=64, help="sequences decoding together")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--new", type=int, default=96, help="new tokens per sequence (traced steps)")
    p.add_argument("--prefill-batch", type=int, default=8, help="sequences prefilling at once")
    p.add_argument("--out", default="bench/out/trace.json", help="JSON results file")
    p.set_defaults(run=run)
