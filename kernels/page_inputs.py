"""How the decode kernels take their pages: 4D or flat 16-bit rows, or the two sides of one
quantized array of rows."""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.quantized_pages import QuantizedPages


def page_shape(pages, block_size: int | None) -> tuple[int, ...]:
    """`[num_blocks, block_size, heads, dim]` of 4D pages, or of flat rows `[num_blocks *
    block_size, heads, dim]` with their `block_size`."""
    shape = tuple(pages.shape)
    if len(shape) == 4:
        return shape
    if len(shape) != 3 or not block_size or shape[0] % block_size:
        raise UnsupportedSpecError(
            f"pages {shape} are neither [blocks, block_size, heads, dim] nor flat rows of "
            f"blocks of {block_size}"
        )
    return (shape[0] // block_size, block_size, *shape[1:])


def flat_rows(pages: mx.array) -> mx.array:
    """16-bit pages as the flat rows `[num_blocks * block_size, heads, dim]` the kernels read
    (a view of 4D row-contiguous pages; a strided view is copied)."""
    return pages if pages.ndim == 3 else pages.reshape(-1, *pages.shape[2:])


def page_bits(k_pages, v_pages) -> tuple[int, int, int]:
    """(K bits, V bits, group size) of the pages: 16 for pages of the model's dtype, and a
    group size of 0 when neither is quantized."""
    if isinstance(k_pages, QuantizedPages):
        kv = k_pages.kv
        return kv.k_bits, kv.v_bits, kv.group_size
    return 16, 16, 0


def check_quantized_sides(name: str, k_pages, v_pages) -> None:
    """Quantized pages reach the kernels as the two sides of one `QuantizedKVPages`."""
    sides = [isinstance(p, QuantizedPages) for p in (k_pages, v_pages)]
    if any(sides) and not (all(sides) and k_pages.kv.rows is v_pages.kv.rows):
        raise UnsupportedSpecError(
            f"{name}: quantized pages must be the K and V sides of one QuantizedKVPages"
        )
