"""Turning speculative decoding on for a loaded engine (`--draft-model ngram`)."""

from __future__ import annotations

import logging

from mlx_paged.speculative.ngram import NgramProposer
from mlx_paged.speculative.policy import SpeculationPolicy

logger = logging.getLogger(__name__)


def enable_speculation(runner, draft_model: str | None, num_draft_tokens: int) -> None:
    """Give the paged `runner` a prompt lookup drafter (`draft_model` "ngram"; None leaves it
    without) of up to `num_draft_tokens` tokens and the policy that decides each step's kind.

    Raises:
        ValueError: the model keeps recurrent state, which a rejected draft cannot roll back,
            or decode steps fuse RoPE into attention.
    """
    if draft_model is None:
        return
    if runner.states is not None:
        raise ValueError(
            "speculative decoding cannot roll back recurrent state: this model has "
            "linear-attention or SSM layers; serve it without --draft-model"
        )
    if runner.pool.rope_inv_freq is not None:
        raise ValueError(
            "speculative decoding cannot verify drafts with RoPE fused into attention: that "
            "kernel writes a token's K/V after attending, so a draft's tokens would not see "
            "one another; use --fused-rope off with --draft-model"
        )
    runner.proposer = NgramProposer(num_draft_tokens)
    runner.spec_policy = SpeculationPolicy()
    logger.info("speculative decoding: prompt lookup drafts of up to %d tokens", num_draft_tokens)
