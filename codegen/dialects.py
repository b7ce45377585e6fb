"""Backend dialects: the spellings a kernel template needs for Metal and for CUDA.

Templates reach these as the Jinja variable `dialect` (plain strings) and through the macros of
`kernels/_dialect.jinja` (reductions, barriers, loads). Metal attribute names appear literally in
the rendered body because MLX adds a kernel argument for each attribute name it finds there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dialect:
    """How one backend spells the concepts a kernel body uses."""

    name: str
    tg_x: str  # this threadgroup's index in the grid, per axis
    tg_y: str
    tg_z: str
    num_tg_x: str  # threadgroups along each axis
    num_tg_z: str
    thread_in_tg: str  # 1-D thread index inside the threadgroup
    tg_size: str  # threads in the threadgroup (1-D)
    lane: str  # lane inside the simdgroup / warp
    simd_index: str  # simdgroup / warp index inside the threadgroup
    shared: str  # qualifier of threadgroup-shared arrays
    shared_ptr: str  # address-space qualifier of a pointer into them
    device_ptr: str  # address-space qualifier of a pointer into a kernel argument
    barrier: str  # every thread of the threadgroup
    finite_min: str  # most negative finite float: the online-softmax sentinel
    exp2: str  # fast base-2 exponential of a float
    cos: str  # IEEE-accurate cosine and sine of a float (RoPE angles reach thousands of radians)
    sin: str
    rsqrt: str  # 1 / sqrt of a float, as MLX's RMSNorm computes it
    exp: str  # IEEE-accurate exponential of a float, as MLX's sigmoid computes it
    align16: str  # qualifier that makes a thread-local array 16-byte aligned
    mlx_dtype_names: dict


METAL = Dialect(
    name="metal",
    tg_x="threadgroup_position_in_grid.x",
    tg_y="threadgroup_position_in_grid.y",
    tg_z="threadgroup_position_in_grid.z",
    num_tg_x="threadgroups_per_grid.x",
    num_tg_z="threadgroups_per_grid.z",
    thread_in_tg="thread_index_in_threadgroup",
    tg_size="threads_per_threadgroup.x",
    lane="thread_index_in_simdgroup",
    simd_index="simdgroup_index_in_threadgroup",
    shared="threadgroup",
    shared_ptr="threadgroup ",
    device_ptr="device ",
    barrier="threadgroup_barrier(mem_flags::mem_threadgroup)",
    finite_min="Limits<float>::finite_min",
    exp2="fast::exp2",
    cos="precise::cos",
    sin="precise::sin",
    rsqrt="precise::rsqrt",
    exp="metal::exp",
    align16="",
    mlx_dtype_names={"float16": "float16_t", "bfloat16": "bfloat16_t", "float32": "float"},
)

CUDA = Dialect(
    name="cuda",
    tg_x="blockIdx.x",
    tg_y="blockIdx.y",
    tg_z="blockIdx.z",
    num_tg_x="gridDim.x",
    num_tg_z="gridDim.z",
    thread_in_tg="threadIdx.x",
    tg_size="blockDim.x",
    lane="(threadIdx.x & 31)",
    simd_index="(threadIdx.x >> 5)",
    shared="__shared__",
    shared_ptr="",
    device_ptr="",
    barrier="__syncthreads()",
    finite_min="Limits<float>::finite_min()",
    exp2="exp2f",
    cos="cosf",
    sin="sinf",
    rsqrt="rsqrtf",
    exp="expf",
    align16="alignas(16) ",
    mlx_dtype_names={"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float"},
)

DIALECTS = {"metal": METAL, "cuda": CUDA}


def get_dialect(backend: str) -> Dialect:
    """The dialect of `backend` ("metal" or "cuda")."""
    try:
        return DIALECTS[backend]
    except KeyError:
        raise ValueError(f"unknown kernel backend {backend!r} (metal or cuda)") from None
