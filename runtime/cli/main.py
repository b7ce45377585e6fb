"""`mlx-paged` command line: serve, bench, kernels."""

from __future__ import annotations

import argparse
import logging
import sys

from mlx_paged.cli.serve import serve
from mlx_paged.cli.serve_args import add_serve_args
from mlx_paged.process import LOG_FORMAT


class HelpFormatter(argparse.HelpFormatter):
    """Shows every flag's default, unless its help already says it or it has none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text + " (default: %(default)s)"
        return text


def walk_parsers(parser: argparse.ArgumentParser):
    """`parser` and every subcommand's parser under it."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from walk_parsers(sub)


def build_parser() -> argparse.ArgumentParser:
    """The `mlx-paged` parser with every subcommand."""
    parser = argparse.ArgumentParser(prog="mlx-paged", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="serve a model over an OpenAI-compatible API"))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from mlx_paged.cli.bench import add_bench_parsers

    add_bench_parsers(bench_sub)

    from mlx_paged.cli.kernels import add_kernels_parser

    add_kernels_parser(sub)
    for p in walk_parsers(parser):
        p.formatter_class = HelpFormatter
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
