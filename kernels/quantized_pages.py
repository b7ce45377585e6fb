"""Quantized K/V pages: MLX's affine layout (the one `mx.quantize` and mlx-lm's
`QuantizedKVCache` use), per token and head, in groups along the head dim.

A page pool of `(num_blocks, block_size, heads, head_dim)` values is stored as packed values,
`(…, head_dim * bits / 32)` uint32, plus one scale and one bias per group, `(…, head_dim /
group_size)` in the model's dtype; `value = scale * q + bias`.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx

KV_BITS = (16, 8, 4)  # 16: pages of the model's dtype, not quantized
KV_GROUP_SIZES = (32, 64)


class QuantizedPages(NamedTuple):
    """One layer's K or V pages, quantized (a tuple of arrays, so `mx.eval` and `mx.compile`
    take it as they take plain pages)."""

    packed: mx.array
    scales: mx.array
    biases: mx.array
    bits: int
    group_size: int

    @classmethod
    def zeros(cls, shape: tuple[int, ...], dtype: mx.Dtype, bits: int, group_size: int):
        """Pages of `shape` (`(…, head_dim)`) that hold zeros."""
        *lead, dim = shape
        return cls(
            mx.zeros((*lead, dim * bits // 32), dtype=mx.uint32),
            mx.zeros((*lead, dim // group_size), dtype=dtype),
            mx.zeros((*lead, dim // group_size), dtype=dtype),
            bits,
            group_size,
        )

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the values the pages hold, as plain pages would have it."""
        return (*self.packed.shape[:-1], self.packed.shape[-1] * 32 // self.bits)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes + self.biases.nbytes

    def gather(self, block_ids: mx.array) -> QuantizedPages:
        """The blocks `block_ids` (along the first axis), still quantized."""
        return self._replace(
            packed=self.packed[block_ids], scales=self.scales[block_ids],
            biases=self.biases[block_ids],
        )  # fmt: skip

    def dequantize(self) -> mx.array:
        """The values, in the scales' dtype."""
        return mx.dequantize(self.packed, self.scales, self.biases, group_size=self.group_size,
                             bits=self.bits)  # fmt: skip

    def write(self, slots: tuple[mx.array, mx.array], values: mx.array) -> QuantizedPages:
        """Quantize `values` `(N, heads, head_dim)` and scatter them to `slots` (block ids,
        offsets in the block); returns the pages, updated in place."""
        quantized = mx.quantize(values, group_size=self.group_size, bits=self.bits)
        for page, new in zip(self[:3], quantized):
            page[slots] = new  # in place: the scatter may reuse the buffer
        return self


def page_bytes_per_token(heads: int, head_dim: int, dtype: mx.Dtype, bits: int, group: int) -> int:
    """Bytes one token takes in one layer's K (or V) pages."""
    if bits == 16:
        return heads * head_dim * dtype.size
    return heads * (head_dim * bits // 8 + 2 * (head_dim // group) * dtype.size)


def check_kv_quantization(k_bits: int, v_bits: int, group_size: int, head_dim: int) -> None:
    """Raise a clear error for bits, group sizes or head dims the quantized pages cannot take."""
    for name, bits in (("K", k_bits), ("V", v_bits)):
        if bits not in KV_BITS:
            raise ValueError(f"{name} pages take {', '.join(map(str, KV_BITS))} bits, not {bits}")
    if group_size not in KV_GROUP_SIZES:
        raise ValueError(f"--kv-group-size must be 32 or 64, not {group_size}")
    if min(k_bits, v_bits) < 16 and head_dim % group_size:
        raise ValueError(
            f"the model's head dim ({head_dim}) is not a multiple of --kv-group-size "
            f"({group_size}), so its K/V cannot be quantized in those groups; try 32"
        )
