"""`mlx-paged bench ...` subcommands; the benchmarks themselves live in `mlx_paged.bench`."""

from __future__ import annotations

import argparse
import sys


def _not_yet(what: str, issue: str):
    def run(_args) -> int:
        print(f"mlx-paged bench {what}: not implemented yet ({issue})", file=sys.stderr)
        return 2
    return run


def _throughput(args) -> int:
    from mlx_paged.bench.throughput import main

    return main(args)


def add_bench_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("throughput", help="engine tokens/s vs mlx-lm's BatchGenerator")
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="bench/out/throughput.json", help="JSON results file")
    p.set_defaults(run=_throughput)
    for name, issue in (("kernels", "arrives with the kernel issue"),
                        ("memory", "arrives with the paged KV issue"),
                        ("serve", "arrives with the paged KV issue")):
        sub.add_parser(name, help=f"({issue})").set_defaults(run=_not_yet(name, issue))
