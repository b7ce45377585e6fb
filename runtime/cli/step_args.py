"""The serve flags that size a step's prompt work, and the prefix cache's switch."""

from __future__ import annotations

import argparse

from mlx_paged.cli.arg_types import non_negative_float, positive, ratio_or_zero


def add_step_args(p: argparse.ArgumentParser) -> None:
    """`--no-prefix-caching`, `--prefill-chunk-seconds`, `--prefill-itl-ratio`,
    `--max-num-batched-tokens` and `--step-log`."""
    p.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="turn off automatic prefix caching (paged path)",
    )
    p.add_argument(
        "--prefill-chunk-seconds",
        type=non_negative_float,
        default=0.5,
        help="how long a step with prompt work may take: prompt chunks are sized from measured "
        "step times and shared equally among prompts, so a long prompt holds neither a short "
        "one's first token nor a hang-up for its whole prefill (paged path; 0 turns it off; "
        "default 0.5)",
    )
    p.add_argument(
        "--prefill-itl-ratio",
        type=ratio_or_zero,
        default=0.0,
        help="while streams decode, how many decode steps' time a step with prompt work may "
        "take (its prompt work keeps at least a third of it): prompts arriving together enter "
        "over several steps instead of stretching every stream's next token (paged path, with "
        "--prefill-chunk-seconds; e.g. 3; default 0: off)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=positive,
        default=None,
        help="most tokens a step runs while requests decode, decode rows included: prompts "
        "are prefilled in chunks inside decode steps, so running streams keep their pace; a "
        "step with nothing decoding runs whole chunks (paged path; default: no budget)",
    )
    p.add_argument(
        "--step-log",
        default=None,
        metavar="PATH",
        help="append one JSON line a step to PATH: its wall time, prompt and generated tokens, "
        "whether prompt chunks rode in its decode forward, and its build / dispatch / device "
        "wait split (to find the steps behind long inter-token gaps; default: none)",
    )
