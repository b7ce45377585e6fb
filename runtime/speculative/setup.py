"""Turning speculative decoding on for a loaded engine: `--draft-model ngram` (prompt lookup)
or `--draft-model PATH` (a smaller model sharing the tokenizer, with its own paged pool)."""

from __future__ import annotations

import logging

from mlx_paged.runner.paged_setup import build_paged_path, paged_block_bytes
from mlx_paged.speculative.draft_model import DraftModelProposer
from mlx_paged.speculative.ngram import NgramProposer
from mlx_paged.speculative.policy import SpeculationPolicy

logger = logging.getLogger(__name__)


def load_draft(draft_model: str | None, tokenizer):
    """The draft model of `--draft-model PATH` (a local folder or hub name), checked to share
    the target's vocabulary; None for prompt lookup or no speculation."""
    if draft_model in (None, "ngram"):
        return None
    from mlx_paged.models.loader import load_model

    model, draft_tokenizer, _, config = load_model(draft_model)
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"draft model {draft_model!r} does not share the served model's tokenizer: its "
            "token ids would mean other text"
        )
    return model, config.get("model_type", "")


def draft_pool_share(draft, config) -> int:
    """Bytes a block of the draft's K/V takes: its pool holds the target's tokens out of the
    same budget (0 without a draft model)."""
    if draft is None:
        return 0
    return paged_block_bytes(draft[0], config.block_size)


def enable_speculation(runner, config, draft=None) -> None:
    """Give the paged `runner` its drafter (prompt lookup, or `draft`'s model on a pool of as
    many blocks as the target's) and the policy that decides each step's kind.

    Raises:
        ValueError: a model keeps recurrent state, which a rejected draft cannot roll back,
            or decode steps fuse RoPE into attention.
    """
    if config.draft_model is None:
        return
    _check_target(runner)
    k = config.num_draft_tokens
    if draft is None:
        runner.proposer = NgramProposer(k)
        logger.info("speculative decoding: prompt lookup drafts of up to %d tokens", k)
    else:
        model, model_type = draft
        draft_runner, draft_kv = build_paged_path(
            model, model_type, block_size=config.block_size, kv_budget_bytes=None,
            num_blocks=runner.kv.block_pool.num_blocks, enable_prefix_caching=False,
            paged_attention=config.paged_attention, compile_decode="off", kv_groups=False,
            lean_decode=config.lean_decode,
        )  # fmt: skip
        if draft_runner.states is not None:
            raise ValueError("the draft model keeps recurrent state: pick an attention-only one")
        runner.proposer = DraftModelProposer(draft_runner, draft_kv, k, config.prefill_step_size)
        logger.info("speculative decoding: drafts of up to %d tokens from %s", k,
                    config.draft_model)  # fmt: skip
    runner.spec_policy = SpeculationPolicy()


def draft_prefill_shapes(runner):
    """The bucketed prefill shapes of `runner`'s draft model's pool (CUDA), or None."""
    proposer = getattr(runner, "proposer", None)
    if not isinstance(proposer, DraftModelProposer):
        return None
    return proposer.runner.pool.prefill_shapes


def _check_target(runner) -> None:
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
