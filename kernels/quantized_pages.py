"""Quantized K/V pages: one array per layer whose rows hold a token's K and V for one head.

A row is 32-bit words: K's values, V's values, then the scales and biases of each quantized
side (K's first), padded to 16 bytes where a side is at 16 bits (its values load 16 bytes at a
time) and to 8 bytes otherwise (which rows of two quantized sides already are). A quantized
side keeps MLX's affine layout (the one `mx.quantize` and mlx-lm's `QuantizedKVCache` use):
values packed from the low bits of each word up, one scale and one bias per group of
`group_size` along the head dim, in the model's dtype, `value = scale * q + bias`. A side at 16
bits keeps the model's dtype. K and V in one row make a decode step's write one quantize and
one scatter a layer (`quantize_rows.py`).
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

KV_BITS = (16, 8, 4)  # 16: pages of the model's dtype, not quantized
KV_GROUP_SIZES = (32, 64)


class RowLayout(NamedTuple):
    """Byte offsets of each part of a row (None: that side is at 16 bits and has no scales)."""

    k_values: int
    v_values: int
    k_scales: int | None
    k_biases: int | None
    v_scales: int | None
    v_biases: int | None
    used_bytes: int  # the parts' bytes; the rest of the row is zero padding
    row_bytes: int

    @property
    def alignment(self) -> int:
        """The widest load, in bytes, that every row start allows (8 or 16)."""
        return 16 if self.row_bytes % 16 == 0 else 8

    def scales(self, side: str) -> tuple[int | None, int | None]:
        return (self.k_scales, self.k_biases) if side == "k" else (self.v_scales, self.v_biases)


def row_layout(
    head_dim: int, itemsize: int, k_bits: int, v_bits: int, group: int, value_dim: int = 0
) -> RowLayout:
    """Where K's and V's values, scales and biases sit in a row (see the module docstring);
    `value_dim`: V's size where it is not K's (latent pages: the RoPE key part)."""
    dims = (head_dim, value_dim or head_dim)

    def values_bytes(bits: int, dim: int) -> int:
        return dim * itemsize if bits == 16 else dim * bits // 8

    offset = values_bytes(k_bits, dims[0]) + values_bytes(v_bits, dims[1])
    scale_offsets = []
    for bits, dim in zip((k_bits, v_bits), dims):
        if bits == 16:
            scale_offsets += [None, None]
            continue
        part = dim // group * itemsize
        scale_offsets += [offset, offset + part]
        offset += 2 * part
    align = 16 if 16 in (k_bits, v_bits) else 8
    row = -(-offset // align) * align
    return RowLayout(0, values_bytes(k_bits, dims[0]), *scale_offsets, offset, row)


class QuantizedKVPages(NamedTuple):
    """One layer's K and V pages, quantized: `rows` is `(num_blocks, block_size, heads,
    row_words)` uint32 (a tuple of an array and constants, so `mx.eval` and `mx.compile` take
    it as they take plain pages)."""

    rows: mx.array
    head_dim: int
    k_bits: int
    v_bits: int
    group_size: int
    dtype_name: str  # the model's dtype, which scales, biases and 16-bit sides are in
    value_dim: int = 0  # V's size where it is not `head_dim` (latent pages), else 0

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: mx.Dtype, k_bits: int, v_bits: int,
              group_size: int, value_dim: int = 0) -> QuantizedKVPages:  # fmt: skip
        """Pages of `shape` (`(…, head_dim)`, as plain K pages would have it) that hold zeros;
        `value_dim`: V's size where it is not K's."""
        if min(k_bits, v_bits) == 16:
            raise ValueError("quantized pages need K or V below 16 bits; use plain pages")
        *lead, dim = shape
        value_dim = 0 if value_dim == dim else value_dim
        layout = row_layout(dim, dtype.size, k_bits, v_bits, group_size, value_dim)
        rows = mx.zeros((*lead, layout.row_bytes // 4), dtype=mx.uint32)
        return cls(rows, dim, k_bits, v_bits, group_size, _dtype_name(dtype), value_dim)

    @classmethod
    def from_values(cls, keys: mx.array, values: mx.array, k_bits: int, v_bits: int,
                    group_size: int) -> QuantizedKVPages:  # fmt: skip
        """Pages holding `keys` and `values` (plain pages), quantized."""
        pages = cls.zeros(keys.shape, keys.dtype, k_bits, v_bits, group_size, values.shape[-1])
        return pages._replace(rows=pack_rows(pages, keys, values))

    @property
    def dtype(self) -> mx.Dtype:
        return getattr(mx, self.dtype_name)

    @property
    def layout(self) -> RowLayout:
        return row_layout(self.head_dim, self.dtype.size, self.k_bits, self.v_bits,
                          self.group_size, self.value_dim)  # fmt: skip

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of K's values, as plain pages would have it."""
        return (*self.rows.shape[:-1], self.head_dim)

    def side_dim(self, side: str) -> int:
        """The size of one side's values ("k" or "v")."""
        return (self.value_dim or self.head_dim) if side == "v" else self.head_dim

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes

    @property
    def k(self) -> QuantizedPages:
        return QuantizedPages(self, "k")

    @property
    def v(self) -> QuantizedPages:
        return QuantizedPages(self, "v")

    def gather(self, block_ids: mx.array) -> QuantizedKVPages:
        """The blocks `block_ids` (along the first axis), still quantized."""
        return self._replace(rows=self.rows[block_ids])

    def write(self, slots: tuple[mx.array, mx.array], keys: mx.array, values: mx.array):
        """Quantize `(N, heads, head_dim)` keys and values into rows and scatter them to `slots`
        (block ids, offsets in the block); returns the pages, updated in place."""
        # Imported here: the kernel module reaches this one through the kernel specs.
        from mlx_paged.kernels.quantize_rows import quantize_rows

        self.rows[slots] = quantize_rows(self, keys, values)  # in place: may reuse the buffer
        return self


class QuantizedPages(NamedTuple):
    """One side (K or V) of `QuantizedKVPages`, as the reference path and the kernels take it."""

    kv: QuantizedKVPages
    side: str  # "k" or "v"

    @property
    def bits(self) -> int:
        return self.kv.k_bits if self.side == "k" else self.kv.v_bits

    @property
    def group_size(self) -> int:
        return self.kv.group_size

    @property
    def dtype(self) -> mx.Dtype:
        return self.kv.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.kv.rows.shape[:-1], self.kv.side_dim(self.side))

    def gather(self, block_ids: mx.array) -> QuantizedPages:
        return QuantizedPages(self.kv.gather(block_ids), self.side)

    def dequantize(self) -> mx.array:
        """The side's values, in the model's dtype."""
        rows, layout, dtype = self.kv.rows, self.kv.layout, self.dtype
        dim = self.kv.side_dim(self.side)
        start = (layout.k_values if self.side == "k" else layout.v_values) // 4
        if self.bits == 16:
            return rows[..., start : start + dim * dtype.size // 4].view(dtype)
        packed = rows[..., start : start + dim * self.bits // 32]
        # The side's scales, then its biases: whole words, one view for both.
        groups = dim // self.group_size
        first = layout.scales(self.side)[0] // 4
        both = rows[..., first : first + 2 * groups * dtype.size // 4].view(dtype)
        return mx.dequantize(packed, both[..., :groups], both[..., groups:],
                             group_size=self.group_size, bits=self.bits)  # fmt: skip


def pack_rows(pages: QuantizedKVPages, keys: mx.array, values: mx.array) -> mx.array:
    """Rows of `pages`' layout holding `keys` and `values` (`(…, head_dim)`), with MLX ops:
    `mx.quantize` per quantized side, then the parts side by side."""
    dtype, group = pages.dtype, pages.group_size
    parts, scales = [], []
    for x, bits in ((keys, pages.k_bits), (values, pages.v_bits)):
        x = x.astype(dtype)
        if bits == 16:
            parts.append(x.view(mx.uint8))
            continue
        packed, s, b = mx.quantize(x, group_size=group, bits=bits)
        parts.append(packed.view(mx.uint8))
        scales += [s.view(mx.uint8), b.view(mx.uint8)]
    row = mx.concatenate(parts + scales, axis=-1)
    pad = pages.layout.row_bytes - row.shape[-1]
    if pad:
        row = mx.pad(row, [(0, 0)] * (row.ndim - 1) + [(0, pad)])
    return row.view(mx.uint32)


def _dtype_name(dtype: mx.Dtype) -> str:
    return {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}[dtype]


def layer_bytes_per_token(heads: int, head_dim: int, dtype: mx.Dtype, k_bits: int, v_bits: int,
                       group: int, value_dim: int | None = None) -> int:  # fmt: skip
    """Bytes one token takes in one layer's pages, K and V together; `value_dim`: V's head size
    where it is not K's."""
    value_dim = value_dim or head_dim
    if k_bits == v_bits == 16:
        return heads * (head_dim + value_dim) * dtype.size
    extra = 0 if value_dim == head_dim else value_dim
    return heads * row_layout(head_dim, dtype.size, k_bits, v_bits, group, extra).row_bytes


def check_kv_quantization(k_bits: int, v_bits: int, group_size: int, head_dim: int) -> None:
    """Raise a clear error for bits, group sizes or head dims the quantized pages cannot take."""
    for name, bits in (("K", k_bits), ("V", v_bits)):
        if bits not in KV_BITS:
            raise ValueError(f"{name} pages take {', '.join(map(str, KV_BITS))} bits, not {bits}")
    if group_size not in KV_GROUP_SIZES:
        raise ValueError(f"--kv-group-size must be 32 or 64, not {group_size}")
    if min(k_bits, v_bits) < 16 and head_dim % group_size:
        fits = [g for g in KV_GROUP_SIZES if head_dim % g == 0]
        way_out = f"try --kv-group-size {fits[0]}" if fits else "serve it with --kv-bits 16"
        raise ValueError(
            f"the model's head dim ({head_dim}) is not a multiple of --kv-group-size "
            f"({group_size}), so its K/V cannot be quantized in those groups; {way_out}"
        )


def ring_refuses_quantized(k_bits: int, v_bits: int) -> str | None:
    """Why the tensor-core ring kernels cannot stage these quantized pages, or None."""
    if max(k_bits, v_bits) == 16:
        return "the tensor-core ring stages both sides quantized or both at 16 bits"
    return None
