"""`mlx-paged bench ...` subcommands; the benchmarks themselves live in `mlx_paged.bench`."""

from __future__ import annotations

import argparse
import importlib
import sys


def _not_yet(what: str, issue: str):
    def run(_args) -> int:
        print(f"mlx-paged bench {what}: not implemented yet ({issue})", file=sys.stderr)
        return 2
    return run


def _bench(module: str):
    """Run `mlx_paged.bench.<module>.main`, imported only when that benchmark is asked for."""
    def run(args) -> int:
        return importlib.import_module(f"mlx_paged.bench.{module}").main(args)
    return run


def add_bench_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("throughput", help="engine tokens/s vs mlx-lm's BatchGenerator")
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/out/throughput.json", help="JSON results file")
    p.set_defaults(run=_bench("throughput"))

    p = sub.add_parser("memory", help="KV memory density: paged vs contiguous vs BatchGenerator")
    p.add_argument("--budget-tokens", type=int, default=16384,
                   help="KV budget, in tokens of the benchmark model (default 16384)")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--cap", type=int, default=16,
                   help="decode batch cap for the paths without a KV budget (default 16)")
    p.add_argument("--out", default="bench/out/memory.json", help="JSON results file")
    p.set_defaults(run=_bench("memory"))

    p = sub.add_parser("prefix-cache", help="TTFT with a repeated system prompt, cold vs warm")
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2)")
    p.add_argument("--system-tokens", type=int, default=300)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--out", default="bench/out/prefix-cache.json", help="JSON results file")
    p.set_defaults(run=_bench("prefix_cache"))

    for name, issue in (("kernels", "arrives with the kernel issue"),
                        ("serve", "a server load benchmark is not written yet")):
        sub.add_parser(name, help=f"({issue})").set_defaults(run=_not_yet(name, issue))
