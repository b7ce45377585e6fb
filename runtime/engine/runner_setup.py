"""The engine's model runner for its configuration: mlx-lm's contiguous caches, or the paged
path, with speculative decoding's drafter where `--draft-model` asks for one."""

from __future__ import annotations

from mlx_paged.engine.config import EngineConfig
from mlx_paged.runner.chunk_rows import CHUNK_ROW_READS
from mlx_paged.runner.contiguous_runner import ContiguousRunner
from mlx_paged.runner.paged_setup import build_paged_path
from mlx_paged.speculative.setup import draft_pool_share, enable_speculation, load_draft


def build_runner(model, model_type: str, config: EngineConfig, max_model_len: int, tokenizer):
    """(runner, KV cache manager): the paged path's, or the contiguous runner and None."""
    if not config.kv_paged:
        return ContiguousRunner(model, prefill_step_size=config.prefill_step_size), None
    draft = load_draft(config.draft_model, tokenizer)
    runner, kv = build_paged_path(
        model, model_type, block_size=config.block_size,
        kv_budget_bytes=config.kv_budget_bytes, num_blocks=config.num_blocks,
        enable_prefix_caching=config.enable_prefix_caching,
        paged_attention=config.paged_attention, compile_decode=config.compile_decode,
        fused_rope=config.fused_rope, lean_decode=config.lean_decode,
        max_num_tokens=config.max_num_seqs * max_model_len,
        k_bits=config.k_bits, v_bits=config.v_bits, kv_group_size=config.kv_group_size,
        max_live_requests=config.max_num_seqs + config.max_num_prefill_seqs,
        kv_groups=config.kv_groups, shared_block_bytes=draft_pool_share(draft, config),
    )  # fmt: skip
    enable_speculation(runner, config, draft)
    return runner, kv


def scheduling_limits(runner, kv) -> dict:
    """The scheduler's arguments that follow from the runner: the paged path's chunk alignment,
    its rows that start in the decode forward, and the reads of chunks that ride as rows."""
    if kv is None:
        return {"prefill_align": 1, "start_in_decode": False}
    as_rows = runner.pool.chunks_as_rows
    return {"prefill_align": runner.pool.prefill_align, "start_in_decode": True,
            "chunk_read_limit": CHUNK_ROW_READS if as_rows else None}  # fmt: skip
