"""The serve flags of speculative decoding, named as mlx_lm.server names them."""

from __future__ import annotations

import argparse


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    """`--draft-model` and `--num-draft-tokens`."""
    p.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding: 'ngram' drafts by prompt lookup over each request's own "
        "tokens and verifies the drafts in the batch (paged path; draft models are not built "
        "yet). Off by default",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=4,
        help="most tokens a speculative draft holds (default 4)",
    )
