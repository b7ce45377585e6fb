"""The serve flags of speculative decoding, named as mlx_lm.server names them."""

from __future__ import annotations

import argparse


def add_speculation_args(p: argparse.ArgumentParser) -> None:
    """`--draft-model` and `--num-draft-tokens`."""
    p.add_argument(
        "--draft-model",
        default=None,
        help="speculative decoding (paged path): 'ngram' drafts by prompt lookup over each "
        "request's own tokens; a model folder or hub name drafts with that smaller model, "
        "which must share the tokenizer (its K/V takes its share of --kv-budget). The drafts "
        "are verified in the batch. Off by default",
    )
    p.add_argument(
        "--num-draft-tokens",
        type=int,
        default=4,
        help="most tokens a speculative draft holds (default 4)",
    )
