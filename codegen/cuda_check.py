"""Compile check of generated CUDA kernels on machines without a GPU.

NVRTC (the `nvidia-cuda-nvrtc-cu12` wheel, headers from `nvidia-cuda-runtime-cu12`) compiles a
kernel's body inside the signature MLX writes for it (`cuda_shim.h` stands in for MLX's device
headers) down to sm_90a machine code, and ptxas reports the registers and spills per thread:
the occupancy figures a kernel author tunes against. Failures raise `CudaCheckError` with the
compiler log.
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from .build import KernelDefinition
from .dialects import CUDA

SHIM = Path(__file__).resolve().parent / "cuda_shim.h"
ARCH = "sm_90a"  # what MLX asks NVRTC for on an H100/H200
# Inputs and outputs whose element type is not the kernel's `T`.
_ARG_TYPES = {
    "block_tables": "int32_t",
    "seq_lens": "int32_t",
    "window": "int32_t",
    "counters": "int32_t",
    "counters_next": "int32_t",
    "scale": "float",
    "softcap": "float",
    "rope_inv_freq": "float",
    "partial_out": "float",
    "partial_max": "float",
    "partial_sum": "float",
    "partials": "float",
    "kv_pages": "uint32_t",  # quantized pages' rows
    "rows": "uint32_t",
    "g": "float",  # the gated-delta recurrence's decay and state
    "state": "float",
    "state_out": "float",
    "a_log": "float",  # the gated-delta decode step's decay rate, fp32 as mlx-lm reads it
    "eps": "float",  # the layer kernels' RMSNorm epsilon
    "positions": "int32_t",
    "slots": "int32_t",  # the page-writing qkv_rope's flat slot per row
}


class CudaCheckError(RuntimeError):
    """NVRTC rejected the generated CUDA source (or is not installed); the message says why."""


@dataclass(frozen=True)
class CudaReport:
    """What ptxas said about one compiled kernel."""

    registers: int
    spill_bytes: int  # spill stores + spill loads, per thread
    shared_bytes: int  # static shared memory
    log: str


@functools.lru_cache(maxsize=1)
def _nvrtc():
    try:
        import nvidia.cuda_nvrtc
        import nvidia.cuda_runtime
    except ImportError as exc:
        raise CudaCheckError(
            "the CUDA compile check needs NVRTC: pip install "
            "nvidia-cuda-nvrtc-cu12 nvidia-cuda-runtime-cu12"
        ) from exc
    lib_dir = Path(next(iter(nvidia.cuda_nvrtc.__path__))) / "lib"
    library = next((p for p in sorted(lib_dir.glob("libnvrtc.so*")) if "alt" not in p.name), None)
    if library is None:
        raise CudaCheckError(f"no libnvrtc.so under {lib_dir}")
    include = Path(next(iter(nvidia.cuda_runtime.__path__))) / "include"
    return ctypes.CDLL(str(library)), include


def wrap(defn: KernelDefinition) -> str:
    """The complete translation unit: shim, the body's header, and MLX's kernel signature."""
    dtype = CUDA.mlx_dtype_names[defn.spec.dtype]
    types = _ARG_TYPES
    args = []
    for name in defn.input_names:
        args.append(f"const {types.get(name, dtype)}* {name}")
        args += [
            f"const __grid_constant__ Shape {name}_shape",
            f"const __grid_constant__ Strides {name}_strides",
            f"const __grid_constant__ int {name}_ndim",
        ]
    args += [f"{types.get(name, dtype)}* {name}" for name in defn.output_names]
    signature = ",\n    ".join(args)
    return (
        f'#include "{SHIM.name}"\n{defn.header}\nnamespace mlx::core::cu {{\n'
        f"__global__ void {defn.name}(\n    {signature}) {{\n"
        f"using T = {dtype};\n{defn.source}\n}}\n}}  // namespace mlx::core::cu\n"
    )


def check_cuda_source(defn: KernelDefinition) -> CudaReport:
    """Compile `defn` with NVRTC for sm_90a; raises `CudaCheckError` on any error."""
    lib, include = _nvrtc()
    source = wrap(defn).encode()
    shim = SHIM.read_bytes()
    prog = ctypes.c_void_p()
    headers = (ctypes.c_char_p * 1)(shim)
    names = (ctypes.c_char_p * 1)(SHIM.name.encode())
    if lib.nvrtcCreateProgram(
        ctypes.byref(prog), source, f"{defn.name}.cu".encode(), 1, headers, names
    ):
        raise CudaCheckError(f"{defn.name}: nvrtcCreateProgram failed")
    options = [
        f"--gpu-architecture={ARCH}",
        "--device-as-default-execution-space",
        "--ptxas-options=-v",
        f"-I{include}",
        "-std=c++17",
    ]
    try:
        status = lib.nvrtcCompileProgram(
            prog, len(options), (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        )
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, buffer)
        log = buffer.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    if status:
        errors = [line for line in log.splitlines() if ": error" in line]
        raise CudaCheckError(f"{defn.name}: NVRTC found {len(errors)} error(s):\n{log[:4000]}")
    return _report(log)


def _report(log: str) -> CudaReport:
    def number(pattern: str) -> int:
        match = re.search(pattern, log)
        return int(match.group(1)) if match else 0

    spills = number(r"(\d+) bytes spill stores") + number(r"(\d+) bytes spill loads")
    return CudaReport(
        registers=number(r"Used (\d+) registers"),
        spill_bytes=spills,
        shared_bytes=number(r"(\d+) bytes smem"),
        log=log,
    )
