"""`KernelSpec`: one of the decode kernels the product routes (`decode_kernels.KERNELS`) at one
attention shape, frozen so it keys the build cache. Its `name` says everything that changes the
code."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.kernels.decode_kernels import KERNELS
from mlx_paged.kernels.quantized_pages import (
    KV_BITS,
    KV_GROUP_SIZES,
    RowLayout,
    ring_refuses_quantized,
    row_layout,
)
from mlx_paged.kernels.quantized_ring_rows import slot_row_stride

BACKENDS = ("metal", "cuda")
DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 80, 96, 128, 192, 256, 512)
BLOCK_SIZES = (8, 16, 32)
GQA_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8)
TENSOR_CORE_HEAD_DIMS = (64, 128)  # the head sizes the H200 sweeps measured
# Quantized pages (`QuantizedKVPages`, whose bits and group sizes these specs take): the head
# sizes whose lanes each read 8 values, one whole group's slice (head_dim / 8 lanes).
QUANT_HEAD_DIMS = (64, 128, 256)

DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}  # in kernel names


class UnsupportedSpecError(ValueError):
    """A kernel or shape this project does not generate; the message names the spec."""


@dataclass(frozen=True)
class KernelSpec:
    """One kernel (a key of `KERNELS`) at one shape, e.g.
    `decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024` or `decode_simt_metal_f32_hd80_bs8_g3_sw`
    (`pN`: tokens per partition of a split kernel; `sw`: sliding-window support; `dvN`: V
    heads of N where not K's size; `ck`: chunked attention (llama4); `sc`: soft-capped scores,
    `cap * tanh(s / cap)` (gemma2)).

    With `rope`, the kernel also does the decode step's RoPE (its name starts `decode_rope_`):
    it takes the step's unrotated query, key and value, rotates the query and key, attends over
    the pages plus the new token, and returns the rotated key for the page write.
    """

    kernel: str
    backend: str
    dtype: str
    head_dim: int
    block_size: int = 16
    gqa: int = 1
    partition_size: int = 0
    sliding_window: bool = False
    rope: bool = False
    k_bits: int = 16
    v_bits: int = 16
    group_size: int = 0  # of quantized pages; 0 when both are 16-bit
    value_dim: int = 0  # V's head size where it is not K's (`dvN` in the name); else 0
    chunked: bool = False  # takes a chunk size: keys from the query's chunk on (`ck`)
    softcap: bool = False  # takes a cap: scores become cap * tanh(score / cap) (`sc`)

    def __post_init__(self):
        if self.kernel not in KERNELS:
            raise UnsupportedSpecError(f"{self.kernel!r} is not a kernel ({', '.join(KERNELS)})")
        for field_name, allowed in (
            ("backend", BACKENDS),
            ("dtype", DTYPES),
            ("head_dim", HEAD_DIMS),
            ("block_size", BLOCK_SIZES),
            ("gqa", GQA_GROUPS),
        ):
            if getattr(self, field_name) not in allowed:
                raise UnsupportedSpecError(
                    f"{self.name}: {field_name}={getattr(self, field_name)!r} is not generated "
                    f"(supported: {', '.join(map(str, allowed))})"
                )
        self._check_partition()
        if self.rope and self.is_reduce:
            raise UnsupportedSpecError(f"{self.name}: the reduce pass takes no RoPE")
        if self.tensor_cores:  # which the fused merge's fences need too: CUDA only
            self._check_tensor_cores()
        self._check_quantized()
        self._check_value_dim()
        self._check_score_rules()

    def _check_score_rules(self) -> None:
        reason = (
            "a chunk and a sliding window are two masks" if self.chunked and self.sliding_window
            else None if not (self.chunked or self.softcap)
            else "tensor cores and RoPE compute plain scores" if self.tensor_cores or self.rope
            else "the reduce pass computes no scores to cap" if self.softcap and self.is_reduce
            else None
        )  # fmt: skip
        if reason:
            raise UnsupportedSpecError(f"{self.name}: {reason}")

    def _check_value_dim(self) -> None:
        if not self.value_dim:
            return
        reason = (
            "value_dim is given only where it differs from head_dim"
            if self.value_dim == self.head_dim
            else f"V head sizes are {HEAD_DIMS}" if self.value_dim not in HEAD_DIMS
            else "the tensor-core kernels take K and V of one head size" if self.tensor_cores
            else "the RoPE kernels take K and V of one head size" if self.rope
            else "quantized pages take K and V of one head size" if self.quantized else None
        )  # fmt: skip
        if reason:
            raise UnsupportedSpecError(f"{self.name}: {reason}")

    def _check_quantized(self) -> None:
        if self.k_bits not in KV_BITS or self.v_bits not in KV_BITS:
            raise UnsupportedSpecError(f"{self.name}: pages take {KV_BITS} bits per value")
        if not self.quantized:
            if self.group_size:
                raise UnsupportedSpecError(f"{self.name}: 16-bit pages take no group size")
            return
        if self.group_size not in KV_GROUP_SIZES:
            raise UnsupportedSpecError(
                f"{self.name}: quantized pages come in groups of {KV_GROUP_SIZES}"
            )
        ring = self.tensor_cores and self.stages > 1
        reason = (ring and ring_refuses_quantized(self.k_bits, self.v_bits)) or (
            "the RoPE kernels write 16-bit pages" if self.rope
            else "the reduce pass reads no pages" if self.is_reduce
            else f"lanes of 8 values need head_dim {QUANT_HEAD_DIMS}"
            if self.head_dim not in QUANT_HEAD_DIMS and not self.tensor_cores else None
        )  # fmt: skip
        if reason:
            raise UnsupportedSpecError(f"{self.name}: no quantized pages here: {reason}")

    def _check_partition(self) -> None:
        sizes = KERNELS[self.kernel].partition_sizes
        if not sizes and self.partition_size:
            raise UnsupportedSpecError(
                f"{self.name}: {self.kernel} is a single pass and takes no partition size"
            )
        if sizes and self.partition_size not in sizes:
            raise UnsupportedSpecError(
                f"{self.name}: {self.kernel} is generated for "
                f"partitions of {', '.join(map(str, sizes))} tokens"
            )

    def _check_tensor_cores(self) -> None:
        if self.backend != "cuda":
            raise UnsupportedSpecError(f"{self.name}: tensor-core kernels are CUDA only")
        if self.dtype == "float32":
            raise UnsupportedSpecError(f"{self.name}: tensor-core kernels take bf16/fp16 pages")
        if self.block_size % 16:
            raise UnsupportedSpecError(
                f"{self.name}: tensor-core kernels read 16-token sub-pages (blocks of 16 or 32)"
            )
        if self.head_dim not in TENSOR_CORE_HEAD_DIMS:
            raise UnsupportedSpecError(
                f"{self.name}: tensor-core kernels are generated for "
                f"head_dim {' and '.join(map(str, TENSOR_CORE_HEAD_DIMS))}"
            )

    @property
    def name(self) -> str:
        parts = [
            self.kernel.replace("decode_", "decode_rope_", 1) if self.rope else self.kernel,
            self.backend,
            DTYPE_SHORT.get(self.dtype, str(self.dtype)),
            f"hd{self.head_dim}",
            *([f"dv{self.value_dim}"] if self.value_dim else []),
            f"bs{self.block_size}",
            f"g{self.gqa}",
        ]
        if self.partition_size:
            parts.append(f"p{self.partition_size}")
        if self.quantized:
            parts.append(f"k{self.k_bits}v{self.v_bits}gs{self.group_size}")
        flags = (("sw", self.sliding_window), ("ck", self.chunked), ("sc", self.softcap))
        parts += [flag for flag, on in flags if on]
        return "_".join(parts)

    # What the templates and the launcher read, from the kernel.
    @property
    def tensor_cores(self) -> bool:
        return KERNELS[self.kernel].tensor_cores

    @property
    def stages(self) -> int:
        return KERNELS[self.kernel].stages

    @property
    def unroll(self) -> int:
        return KERNELS[self.kernel].unroll

    @property
    def simdgroups(self) -> int:
        return KERNELS[self.kernel].simdgroups

    @property
    def split(self) -> str:
        return KERNELS[self.kernel].split

    @property
    def fused_reduce(self) -> bool:
        return self.split == "fused"

    @property
    def is_reduce(self) -> bool:
        return self.split == "reduce"

    @property
    def quantized(self) -> bool:
        """K or V pages hold packed values with per-group scales and biases."""
        return min(self.k_bits, self.v_bits) < 16

    @property
    def v_dim(self) -> int:
        """V's head size: the size of each output row."""
        return self.value_dim or self.head_dim

    @property
    def partitioned(self) -> bool:
        return self.partition_size > 0

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @property
    def row_layout(self) -> RowLayout:
        """Where a quantized pages row keeps each part (`quantized_pages.row_layout`)."""
        return row_layout(self.head_dim, self.itemsize, self.k_bits, self.v_bits, self.group_size)

    def pair_half(self, side: str) -> int:
        """H of a side ("k" or "v") that dequantizes two values a step (4 bits, or 8 bits in
        fp16): a packed word's q_k and q_(k+H), H = 16 / bits; 0 for a side at 16 bits or one
        dequantized through fp32 (8 bits in bf16, whose mantissa cannot hold 2^7 + q)."""
        bits = self.k_bits if side == "k" else self.v_bits
        return 16 // bits if bits == 4 or (bits == 8 and self.dtype == "float16") else 0

    @property
    def swapped_math(self) -> bool:
        """Whether the tensor-core math runs with K and V as the mma's A operand
        (`_mma_swapped.jinja`): on quantized pages whose sides both dequantize in pairs."""
        return self.quantized and bool(self.pair_half("k") and self.pair_half("v"))

    @property
    def ring_subpages(self) -> int:
        """16-token sub-pages a quantized ring step takes: 2 under the swapped math, else 1."""
        return 2 if self.swapped_math else 1

    @property
    def ring_row_stride(self) -> int:
        """Bytes between the rows of a quantized ring slot (`quantized_ring_rows.py`)."""
        return slot_row_stride(self.row_layout, self.head_dim, self.k_bits, self.v_bits)

    @classmethod
    def parse(cls, name: str) -> KernelSpec:
        """Inverse of `name`."""
        rope = name.startswith("decode_rope_")
        if rope:
            name = "decode_" + name.removeprefix("decode_rope_")
        kernel = next(
            (k for k in sorted(KERNELS, key=len, reverse=True) if name.startswith(k + "_")), None
        )
        if kernel is None:
            raise UnsupportedSpecError(f"{name!r}: unknown kernel ({', '.join(KERNELS)})")
        fields = name[len(kernel) + 1 :].split("_")
        flags = {}
        for flag in ("sc", "ck", "sw"):  # in reverse of `name`'s order
            flags[flag] = fields[-1] == flag
            fields = fields[:-1] if flags[flag] else fields
        short_to_dtype = {v: k for k, v in DTYPE_SHORT.items()}
        try:
            value_dim = int(fields.pop(3).removeprefix("dv")) if fields[3][:2] == "dv" else 0
            backend, dtype, hd, bs, g, *rest = fields
            partition = int(rest.pop(0).removeprefix("p")) if rest and rest[0][:1] == "p" else 0
            bits = _parse_bits(rest.pop(0)) if rest else (16, 16, 0)
            if rest:
                raise ValueError(rest)
            values = (
                short_to_dtype[dtype],
                int(hd.removeprefix("hd")),
                int(bs.removeprefix("bs")),
                int(g.removeprefix("g")),
            )
        except (ValueError, KeyError, IndexError) as exc:
            raise UnsupportedSpecError(
                f"{name!r} is not a kernel spec name (expected e.g. "
                f"decode_simt_metal_bf16_hd128_bs16_g4)"
            ) from exc
        return cls(kernel, backend, *values, partition, flags["sw"], rope, *bits, value_dim,
                   flags["ck"], flags["sc"])  # fmt: skip


def _parse_bits(field: str) -> tuple[int, int, int]:
    """`k8v4gs32` -> (8, 4, 32)."""
    k, rest = field.removeprefix("k").split("v")
    v, group = rest.split("gs")
    return int(k), int(v), int(group)
