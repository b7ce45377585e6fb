"""`mlx-paged` command line: serve, bench, kernels."""

from __future__ import annotations

import argparse
import logging
import sys

from mlx_paged.cli.serve import serve
from mlx_paged.cli.serve_args import add_serve_args
from mlx_paged.process import LOG_FORMAT


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlx-paged", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="serve a model over an OpenAI-compatible API"))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from mlx_paged.cli.bench import add_bench_parsers

    add_bench_parsers(bench_sub)

    from mlx_paged.cli.kernels import add_kernels_parser

    add_kernels_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if args.command == "serve":
        return serve(args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
