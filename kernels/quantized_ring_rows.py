"""The rows of a quantized ring slot (`_mma_quant_ring.jinja`): a slot holds 16 whole page rows
(a token's K and V for one KV head, `quantized_pages.row_layout`), each padded to the stride
whose lane reads take the fewest shared-memory wavefronts.

The tensor-core lanes read a slot in a fixed pattern: lane (g, t) reads its K slice of rows g
and g + 8 (slice t) and its V slice of rows 2t, 2t + 1, 2t + 8, 2t + 9 (slice g). With rows at
the pages' own stride, those reads fall on the same banks (e.g. rows of 160 bytes: 2-way on K,
4-way on V), so the stride is chosen by counting them."""

from __future__ import annotations

import functools

from mlx_paged.kernels.quantized_pages import RowLayout

BANKS = 32  # 4-byte shared-memory banks; a wavefront serves each bank one word


def read_width(slice_bytes: int, layout: RowLayout) -> int:
    """Bytes a lane loads at a time from its slice: as wide as the slice and the rows'
    alignment allow, 16 at most (`copy_words` in `_mma_quant.jinja`)."""
    return min(16, slice_bytes, layout.alignment)


def _wavefronts(addresses: list[int], width: int) -> int:
    """Wavefronts of one warp-wide load of `width` bytes a lane at `addresses` (lane order):
    the warp is served in phases of 128 bytes' worth of lanes, and each phase takes as many
    wavefronts as the most distinct words any one bank holds."""
    lanes = 128 // width
    total = 0
    for start in range(0, 32, lanes):
        per_bank: dict[int, set[int]] = {}
        for address in addresses[start : start + lanes]:
            for word in range(address // 4, (address + width) // 4):
                per_bank.setdefault(word % BANKS, set()).add(word)
        total += max(len(words) for words in per_bank.values())
    return total


def _slice_reads(stride: int, offset: int, slice_bytes: int, rows, width: int) -> int:
    """Wavefronts of every load of one side's slices: `rows(g, t)` the rows lane (g, t) reads,
    `offset(g, t)` where its slice starts in a row."""
    total = 0
    for i in range(len(rows(0, 0))):
        for piece in range(0, slice_bytes, width):
            addresses = [
                rows(lane >> 2, lane & 3)[i] * stride + offset(lane >> 2, lane & 3) + piece
                for lane in range(32)
            ]
            total += _wavefronts(addresses, width)
    return total


def read_wavefronts(layout: RowLayout, head_dim: int, k_bits: int, v_bits: int,
                    stride: int) -> int:  # fmt: skip
    """Shared-memory wavefronts of one sub-page's K and V slice loads at row `stride`."""
    k_slice, v_slice = head_dim // 4 * k_bits // 8, head_dim // 8 * v_bits // 8
    k = _slice_reads(
        stride, lambda g, t: layout.k_values + t * k_slice, k_slice,
        lambda g, t: (g, g + 8), read_width(k_slice, layout),
    )  # fmt: skip
    v = _slice_reads(
        stride, lambda g, t: layout.v_values + g * v_slice, v_slice,
        lambda g, t: (2 * t, 2 * t + 1, 2 * t + 8, 2 * t + 9), read_width(v_slice, layout),
    )  # fmt: skip
    return k + v


@functools.cache
def slot_row_stride(layout: RowLayout, head_dim: int, k_bits: int, v_bits: int) -> int:
    """Bytes between a slot's rows: the row, padded in steps of its copy width (its
    alignment) by up to 128 bytes, to the stride of fewest read wavefronts (the least padding
    among equals)."""
    candidates = range(layout.row_bytes, layout.row_bytes + 129, layout.alignment)
    return min(candidates, key=lambda s: (read_wavefronts(layout, head_dim, k_bits, v_bits, s), s))
