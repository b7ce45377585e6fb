"""Size and build the paged KV path for a loaded model."""

from __future__ import annotations

import logging
import os

import mlx.core as mx

from mlx_paged.kernels.quantized_pages import check_kv_quantization, layer_bytes_per_token
from mlx_paged.kv.attention_adapters import adapt_attention
from mlx_paged.kv.attention_hook import check_model_supported, install_attention_hook
from mlx_paged.kv.kv_cache_manager import KVCacheManager
from mlx_paged.kv.kv_groups import KVCacheGroups, plan_groups
from mlx_paged.kv.kv_layout import KVLayout, probe_kv_layout
from mlx_paged.kv.paged_cache import PagedKVPool
from mlx_paged.kv.recurrence_hook import fuse_input_projections, install_recurrence_hook
from mlx_paged.kv.state_pool import StatePool, slot_bytes
from mlx_paged.kv.state_slots import StateSlots
from mlx_paged.models.lean_decode import build_lean_decode
from mlx_paged.models.lean_fused import FusedDecode
from mlx_paged.models.weight_views import cache_weight_views
from mlx_paged.runner.attention_setup import choose_attention_paths
from mlx_paged.runner.paged_runner import PagedRunner

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_FRACTION = 0.10
# Most of the budget a hybrid's recurrent-state slots may take; the pages get the rest.
STATE_BUDGET_SHARE = 0.5


def device_memory_bytes() -> int:
    """The accelerator's memory, or the machine's RAM on the CPU backend."""
    info = mx.device_info()
    if info.get("memory_size"):
        return int(info["memory_size"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def kv_bytes_per_token(
    layout: KVLayout, k_bits: int, v_bits: int, group_size: int, groups: KVCacheGroups | None = None
) -> int:
    """Bytes one token's K and V take in a block: one layer of each page array of `groups`
    (None: every layer, each with its own)."""
    groups = groups or KVCacheGroups.single(layout.num_layers)
    return sum(
        layer_bytes_per_token(heads, k_dim, layout.dtype, k_bits, v_bits, group_size, v_dim)
        for heads, k_dim, _, v_dim in (layout.shapes[i] for i in groups.array_layers)
    )


def paged_block_bytes(
    model, block_size: int, k_bits: int = 16, v_bits: int = 16, kv_group_size: int = 64
) -> int:
    """Bytes a block of `block_size` tokens of `model`'s K/V takes in a pool of one KV cache
    group (a draft model's: `shared_block_bytes` of the target's `build_paged_path`)."""
    return block_size * kv_bytes_per_token(paged_layout(model), k_bits, v_bits, kv_group_size)


def paged_layout(model) -> KVLayout:
    """The model's K/V layout on the paged path: probed through the attention hook, with its
    attention adapted as pages need (`adapt_attention`)."""
    install_attention_hook()
    adapt_attention(model)
    return probe_kv_layout(model)


def _log_pool(
    pool: PagedKVPool, token_bytes: int, prefix_caching: bool, states=None, wanted_slots=0
) -> None:
    def bits(b: int) -> str:
        return "16-bit" if b == 16 else f"{b}-bit in groups of {pool.group_size}"

    logger.info(
        "paged KV: %d usable blocks x %d tokens, plus the null block (%.1f MiB, %d B/token, "
        "K %s / V %s), prefix caching %s",
        pool.num_blocks - 1, pool.block_size, pool.nbytes / 2**20, token_bytes,
        bits(pool.k_bits), bits(pool.v_bits), "on" if prefix_caching else "off",
    )  # fmt: skip
    if states is not None:
        logger.info(
            "recurrent state: %d slots for live requests and prefix-cache snapshots x %.2f MiB "
            "over %d state layers (%.1f MiB)",
            states.num_slots - 1, states.slot_bytes / 2**20, len(states.layout),
            states.nbytes / 2**20,
        )  # fmt: skip
        if states.num_slots < wanted_slots:
            logger.warning("the KV budget holds %d recurrent-state slots of the %d wanted for "
                           "live requests and their snapshots: admission waits for a slot",
                           states.num_slots - 1, wanted_slots - 1)  # fmt: skip


def _kv_groups(layout: KVLayout, enabled: bool, quantized: bool) -> KVCacheGroups:
    """The model's KV cache groups (`plan_groups`; one group unless `enabled`), logged."""
    windows = layout.plan.windows if layout.plan else [None] * layout.num_layers
    groups, single_why = plan_groups(windows, list(layout.shapes))
    if quantized and any(groups.read_at_another_shape(list(layout.shapes))):
        groups = KVCacheGroups.single(layout.num_layers)
        single_why = "quantized pages cannot be read at another K/V shape (use --kv-bits 16)"
    if not enabled:
        groups, single_why = KVCacheGroups.single(layout.num_layers), "KV cache groups are off"
    if groups.num_groups > 1:
        logger.info("KV cache groups: %s; a block holds one layer of each of %d page arrays "
                    "(pages a block per group: %s), and a sliding-window group frees the blocks "
                    "its window left", groups.describe(), groups.num_arrays,
                    ", ".join(map(str, groups.scales)))  # fmt: skip
    elif single_why and any(w is not None for w in windows):
        logger.info("sliding windows keep their pages: %s", single_why)
    return groups


def _pool_sizes(
    block_bytes, block_size, kv_budget_bytes, num_blocks, max_num_tokens, slot_bytes=0, slots=0
) -> tuple[int, int]:
    """(blocks, state slots) of the pool: `num_blocks` and `slots`, else the budget's worth
    (see `build_paged_path`): state slots take at most `STATE_BUDGET_SHARE` of it, the pages
    the rest. Slot 0 is never handed out and takes no memory."""
    flag = "--kv-budget" if num_blocks is None else "--num-blocks"
    if num_blocks is None:
        budget = kv_budget_bytes
        if budget is None:
            budget = int(device_memory_bytes() * DEFAULT_MEMORY_FRACTION)
            if max_num_tokens is not None:
                pages = (max_num_tokens // block_size + 2) * block_bytes
                budget = min(budget, pages + (slots - 1) * slot_bytes)
        if slots:
            slots = min(slots, 1 + int(budget * STATE_BUDGET_SHARE) // slot_bytes)
            if slots < 2:
                raise ValueError(
                    f"the KV budget ({budget} bytes) holds no recurrent-state slot of "
                    f"{slot_bytes} bytes beside its pages: raise --kv-budget"
                )
        num_blocks = (budget - max(slots - 1, 0) * slot_bytes) // block_bytes
    if num_blocks < 2:
        raise ValueError(
            f"the KV pool holds {num_blocks} blocks of {block_bytes} bytes; "
            f"it needs at least 2: raise {flag}"
        )
    return num_blocks, slots


def build_paged_path(
    model,
    model_type: str,
    *,
    block_size: int,
    kv_budget_bytes: int | None,
    num_blocks: int | None,
    enable_prefix_caching: bool,
    max_num_tokens: int | None = None,
    paged_attention: str = "auto",
    compile_decode: str = "auto",
    fused_rope: str = "off",
    k_bits: int = 16,
    v_bits: int = 16,
    kv_group_size: int = 64,
    max_live_requests: int = 64,
    kv_groups: bool = True,
    shared_block_bytes: int = 0,
    lean_decode: str = "off",
) -> tuple[PagedRunner, KVCacheManager]:
    """Check the model, size the pool and return (runner, kv manager).

    The pool is `num_blocks`, else `kv_budget_bytes`, else 10% of device memory but never more
    than `max_num_tokens` (all sequences at full context) could use. Decode attention runs the
    generated kernel per `paged_attention`, with RoPE in it per `fused_rope`; `compile_decode`
    replays decode steps from `mx.compile` traces ("auto": with the generated kernels). K and V
    pages hold `k_bits`/`v_bits` per value (16: the model's dtype; 8 or 4: quantized in groups
    of `kv_group_size`, see `QuantizedKVPages`). A hybrid model's recurrent state takes
    `state_pool_slots(max_live_requests)` slots of the budget (one per running or prefilling
    request, as many again for prefix-cache snapshots), or what `STATE_BUDGET_SHARE` of it
    holds, fewer: then admission waits for a slot. `kv_groups`: window layers get groups of
    their own (`kv_groups.py`). Blocks cost `shared_block_bytes` more (a draft's pool).
    `lean_decode`: decode steps run `LeanDecode` ("on") where the model's family allows, or
    `FusedDecode` ("fused"; RoPE then runs in its own kernel, not in attention), or the fused
    one where the blocks allow, else the lean one ("auto").
    """
    rules, layout, lean = _prepare_model(model, model_type, fused_rope, lean_decode)
    fused_rope = _checked_settings(layout, lean, fused_rope, k_bits, v_bits, kv_group_size)
    groups = _kv_groups(layout, kv_groups, min(k_bits, v_bits) < 16)
    block_bytes = block_size * kv_bytes_per_token(layout, k_bits, v_bits, kv_group_size, groups)
    wanted = state_pool_slots(max_live_requests) if layout.state else 0
    num_blocks, num_slots = _pool_sizes(
        block_bytes + shared_block_bytes, block_size, kv_budget_bytes, num_blocks, max_num_tokens,
        slot_bytes(layout.state), wanted,
    )  # fmt: skip
    pool = PagedKVPool(layout.num_layers, num_blocks, block_size, layout.num_kv_heads,
                       layout.head_dim, layout.dtype, k_bits, v_bits, kv_group_size,
                       [(h, k, v) for h, k, _, v in layout.shapes], groups)  # fmt: skip
    bits = (k_bits, v_bits, kv_group_size if min(k_bits, v_bits) < 16 else 0)
    choose_attention_paths(model, layout, pool, paged_attention, fused_rope, bits, rules)
    states = StatePool(layout.state, num_slots) if num_slots else None
    slots = StateSlots(num_slots, enable_prefix_caching) if num_slots else None
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching, slots, groups.windows,
                        groups.scales)  # fmt: skip
    _log_pool(pool, block_bytes // block_size, enable_prefix_caching, states, wanted)
    compiled = compile_decode == "on" or (compile_decode == "auto" and bool(pool.decode_backend))
    return PagedRunner(model, pool, kv, compiled, layout.plan, states, lean), kv


def _checked_settings(layout, lean, fused_rope: str, k_bits: int, v_bits: int, group: int) -> str:
    """Refuse page bits the layout cannot take; the `fused_rope` mode the attention paths then
    take (off beside `FusedDecode`, whose qkv_rope kernel rotates)."""
    # Latent pages quantize their two sides apart; the kernels of per-head pages take one size.
    if layout.values_differ and not layout.latent and min(k_bits, v_bits) < 16:
        raise ValueError(
            "quantized pages keep K and V of one head size, and this model's V heads differ "
            "from its K heads: use --kv-bits 16"
        )
    for head_dim in {dim for _, k, _, v in layout.shapes for dim in (k, v)}:
        check_kv_quantization(k_bits, v_bits, group, head_dim)
    return "off" if isinstance(lean, FusedDecode) else fused_rope


def _prepare_model(model, model_type: str, fused_rope: str, lean_decode: str = "off"):
    """Refuse what pages cannot serve, hook mlx-lm's attention and recurrence, adapt the
    families that need it, and probe the K/V layout; the model's score rules, layout and
    lean decode step (`LeanDecode`, or None)."""
    check_model_supported(model_type)
    install_attention_hook()
    install_recurrence_hook()
    rules = adapt_attention(model)
    if not rules.plain and fused_rope == "on":
        raise ValueError(f"fused RoPE computes plain scores, not {rules}: use --fused-rope off")
    layout = probe_kv_layout(model)
    logger.debug("layers with fused input projections: %d", fuse_input_projections(model))
    lean = None
    if lean_decode == "fused" and layout.state:
        raise ValueError("--lean-decode fused serves attention-only models, not recurrent ones")
    if lean_decode == "fused" and fused_rope == "on":
        raise ValueError("--lean-decode fused applies RoPE itself: use --fused-rope off")
    if lean_decode != "off" and not layout.state:  # stacks weights: before the weight views
        windows = layout.plan.windows if layout.plan else [None] * layout.num_layers
        # The fused step applies RoPE itself: with RoPE asked for in attention, "auto" is "on".
        mode = "on" if fused_rope == "on" else lean_decode
        lean = build_lean_decode(model, windows, mode)
    logger.debug("linear layers reading a cached weight view: %d", cache_weight_views(model))
    return rules, layout, lean


def state_pool_slots(max_live_requests: int) -> int:
    """Slots of a hybrid's state pool: one per live request, as many for snapshots, and the
    unused slot 0."""
    return 2 * max_live_requests + 1
