"""`KernelSpec`: one variant of one kernel, frozen so it can key the build cache."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

BACKENDS = ("metal", "cuda")
DTYPES = ("float16", "bfloat16", "float32")
HEAD_DIMS = (64, 80, 96, 128, 256)
BLOCK_SIZES = (8, 16, 32)
GQA_GROUPS = (1, 2, 3, 4, 5, 6, 7, 8)
PARTITION_SIZES = (0, 128, 256, 512)  # 0: single pass over the whole sequence
# Longer partitions for kernel authors' sweeps (`bench kernels --partition-size`), not catalogued.
LONG_PARTITION_SIZES = (1024, 2048, 4096, 8192, 16384)
# Tuning variants (0 / False: the kernel's own choice), named by a suffix: `_mma` scores and
# P.V on CUDA tensor cores (bf16/fp16), `_u2` (with `_mma`) 2 sub-pages of 16 tokens loaded per
# simdgroup step before their math (more bytes in flight, more registers; with `_sN`, 2 ring
# slots consumed per step under one softmax rescale), `_s3` K/V staged
# through a 3-slot shared-memory ring per simdgroup (`_s1`: straight into registers, the
# default; with `_mma` the fragments come from the ring by ldmatrix), `_t16` lanes per K/V row,
# `_kq` (with `_mma` and a ring) K as the A operand and Q as B (S^T = K Q^T, O^T = V^T P^T),
# `_c4` tokens per softmax chunk, `_w8` simdgroups, `_o4` at least 4 threadgroups per SM (CUDA
# `__launch_bounds__`: ptxas caps the registers to fit, spilling if it must), `_fused` split-K
# in one launch (CUDA: the last partition of each sequence and KV head to finish merges them),
# `_pg` (with `_fused`) partitions whose count the launcher picks to fill the GPU and whose
# length the kernel derives from the grid; pN is then their shortest length. `_pf4` (with
# `_mma_sN`) asks L2 for each sub-page 4 sub-pages before the ring copies it (CUDA). `_lr`
# (with `_mma_sN`) rescales the output accumulators only in steps where a head's max grew;
# `_rt8` only where one grew by more than 8 (log2 units), keeping the older max otherwise.
# `_ea` (with `_mma_sN`) issues the block-id and query loads and the ring's first copies
# before the sequence length arrives. `_tr` (with `_mma_sN`, single pass or `_fused`; a
# diagnostic) writes each threadgroup's SM and phase timestamps to an extra output
# (`bench/phase_trace.py`). `_dw2` (with `_mma_sN_fused`) shares a sequence's pages out two
# at a time from a counter, so the simdgroups that stream fastest take more of them (measured
# no faster on the H200; not routed).
TUNING = (("tensor_cores", "mma"), ("unroll", "u"), ("stages", "s"), ("l2_prefetch", "pf"),
          ("lazy_rescale", "lr"), ("rescale_threshold", "rt"), ("early_loads", "ea"),
          ("phase_trace", "tr"), ("swap_operands", "kq"),
          ("lanes_per_row", "t"),
          ("chunk", "c"), ("simdgroups", "w"), ("occupancy", "o"), ("dynamic_pages", "dw"),
          ("fused_reduce", "fused"), ("grid_partitions", "pg"))
POWERS_OF_TWO = (0, 1, 2, 4, 8, 16, 32)
STAGES = (0, 1, 2, 3, 4, 5, 6, 7, 8)  # past 4: the tensor-core ring only
OCCUPANCIES = (0, 1, 2, 3, 4, 5, 6, 7, 8)
UNROLLS = (0, 1, 2, 3, 4)
PREFETCH_DISTANCES = (0, 1, 2, 3, 4, 6, 8, 12, 16)  # sub-pages
RESCALE_THRESHOLDS = (0, 2, 4, 8)  # log2 units: P values stay below 2^N
DYNAMIC_PAGES = (0, 1, 2, 4, 8)  # pages a simdgroup takes at a time
_FLAGS = ("tensor_cores", "lazy_rescale", "early_loads", "phase_trace", "swap_operands",
          "fused_reduce", "grid_partitions")
OPS = ("paged_decode", "paged_decode_reduce")

_DTYPE_SHORT = {"float16": "f16", "bfloat16": "bf16", "float32": "f32"}


class UnsupportedSpecError(ValueError):
    """A kernel variant this project does not generate; the message names the spec."""


@dataclass(frozen=True)
class KernelSpec:
    """One kernel variant. Its `name` says everything that changes the generated code, e.g.
    `paged_decode_metal_bf16_hd128_bs16_g4_p512` (p0 is the single-pass variant, `_sw` marks
    sliding-window support). Tuning variants for kernel authors add a suffix (see `TUNING`),
    e.g. `_s3_w8`; the catalog and the engine's routing use none."""

    op: str
    backend: str
    dtype: str
    head_dim: int
    block_size: int = 16
    gqa: int = 1
    partition_size: int = 0
    sliding_window: bool = False
    tensor_cores: bool = False
    unroll: int = 0
    stages: int = 0
    l2_prefetch: int = 0
    lazy_rescale: bool = False
    rescale_threshold: int = 0
    early_loads: bool = False
    phase_trace: bool = False
    swap_operands: bool = False
    lanes_per_row: int = 0
    chunk: int = 0
    simdgroups: int = 0
    occupancy: int = 0
    dynamic_pages: int = 0
    fused_reduce: bool = False
    grid_partitions: bool = False

    def __post_init__(self):
        checks = (("op", OPS), ("backend", BACKENDS), ("dtype", DTYPES),
                  ("head_dim", HEAD_DIMS), ("block_size", BLOCK_SIZES), ("gqa", GQA_GROUPS),
                  ("partition_size", PARTITION_SIZES + LONG_PARTITION_SIZES),
                  ("stages", STAGES), ("lanes_per_row", POWERS_OF_TWO),
                  ("chunk", POWERS_OF_TWO), ("simdgroups", POWERS_OF_TWO[:-1]),
                  ("occupancy", OCCUPANCIES), ("unroll", UNROLLS),
                  ("l2_prefetch", PREFETCH_DISTANCES),
                  ("rescale_threshold", RESCALE_THRESHOLDS),
                  ("dynamic_pages", DYNAMIC_PAGES))
        for field_name, allowed in checks:
            value = getattr(self, field_name)
            if value not in allowed:
                raise UnsupportedSpecError(
                    f"{self.name}: {field_name}={value!r} is not generated "
                    f"(supported: {', '.join(map(str, allowed))})")
        if self.op == "paged_decode_reduce" and self.tuning_suffix:
            raise UnsupportedSpecError(f"{self.name}: tuning variants apply to pass 1 only")
        if self.fused_reduce and self.partition_size == 0:
            raise UnsupportedSpecError(f"{self.name}: the fused reduce is a split-K variant "
                                       f"and needs a partition size")
        if self.unroll > 1 and not self.tensor_cores:
            raise UnsupportedSpecError(f"{self.name}: several sub-pages per step are a tensor-core "
                                       f"path loop (mma)")
        if self.swap_operands and not self.tensor_cores:
            raise UnsupportedSpecError(f"{self.name}: kq swaps the operands of the tensor-core "
                                       f"path (mma)")
        if self.grid_partitions and not self.fused_reduce:
            raise UnsupportedSpecError(f"{self.name}: partitions from the grid need the fused "
                                       f"reduce (the reduce kernel's partitions are fixed)")
        if self.dynamic_pages and (not self.fused_reduce or self.grid_partitions):
            raise UnsupportedSpecError(f"{self.name}: dwN shares the pages out among the "
                                       f"partitions of the fused split-K: it needs fused, "
                                       f"not pg")
        if self.op == "paged_decode_reduce" and self.partition_size == 0:
            raise UnsupportedSpecError(f"{self.name}: the reduce kernel needs a partition size")
        if self.partition_size and self.partition_size % self.block_size:
            raise UnsupportedSpecError(
                f"{self.name}: partition size must be a multiple of the block size")

    @property
    def name(self) -> str:
        parts = [self.op, self.backend, _DTYPE_SHORT.get(self.dtype, str(self.dtype)),
                 f"hd{self.head_dim}", f"bs{self.block_size}", f"g{self.gqa}",
                 f"p{self.partition_size}"]
        if self.sliding_window:
            parts.append("sw")
        if self.tuning_suffix:
            parts.append(self.tuning_suffix)
        return "_".join(parts)

    @property
    def tuning_suffix(self) -> str:
        """`s3_t32_c2_w8`-style name of the tuning variant ("" for the kernel's own choices)."""
        parts = []
        for field_name, tag in TUNING:
            value = getattr(self, field_name)
            if value is True:
                parts.append(tag)
            elif value:
                parts.append(f"{tag}{value}")
        return "_".join(parts)

    @staticmethod
    def parse_tuning(suffix: str) -> dict:
        """`"s3_w8"` -> `{"stages": 3, "simdgroups": 8}` (the inverse of `tuning_suffix`)."""
        values: dict = {}
        for token in filter(None, suffix.split("_")):
            for field_name, tag in TUNING:
                if token == tag and field_name in _FLAGS:
                    values[field_name] = True
                    break
                if field_name not in _FLAGS and token.startswith(tag) and token[len(tag):].isdigit():
                    values[field_name] = int(token[len(tag):])
                    break
            else:
                raise UnsupportedSpecError(
                    f"{token!r} in {suffix!r} is not a tuning variant "
                    f"(mma, uN, sN, pfN, lr, rtN, ea, tr, kq, tN, cN, wN, oN, dwN, fused, pg)")
        return values

    @property
    def lazy_rescales(self) -> bool:
        """`lr` or `rtN`: the output accumulators are rescaled only in steps that need it."""
        return self.lazy_rescale or self.rescale_threshold > 0

    @property
    def partitioned(self) -> bool:
        return self.partition_size > 0

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    def with_backend(self, backend: str) -> "KernelSpec":
        """The same variant for another backend."""
        return dataclasses.replace(self, backend=backend)

    @classmethod
    def parse(cls, name: str) -> "KernelSpec":
        """Inverse of `name`: `paged_decode_cuda_bf16_hd128_bs16_g4_p512[_sw][_s3_w8...]`."""
        short_to_dtype = {v: k for k, v in _DTYPE_SHORT.items()}
        op = next((o for o in sorted(OPS, key=len, reverse=True) if name.startswith(o + "_")),
                  None)
        if op is None:
            raise UnsupportedSpecError(f"{name!r}: unknown kernel (ops: {', '.join(OPS)})")
        fields = name[len(op) + 1:].split("_")
        extra = fields[6:]
        sliding = bool(extra) and extra[0] == "sw"
        tuning = cls.parse_tuning("_".join(extra[1:] if sliding else extra))
        try:
            backend, dtype, hd, bs, g, p = fields[:6]
            values = (backend, short_to_dtype[dtype], int(hd.removeprefix("hd")),
                      int(bs.removeprefix("bs")), int(g.removeprefix("g")),
                      int(p.removeprefix("p")))
        except (ValueError, KeyError) as exc:
            raise UnsupportedSpecError(
                f"{name!r} is not a kernel spec name (expected e.g. "
                f"paged_decode_metal_bf16_hd128_bs16_g4_p512)") from exc
        return cls(op, *values, sliding, **tuning)
