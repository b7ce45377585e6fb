"""Small kernel inputs kept out of MLX's CUDA scalar pool.

MLX's CUDA allocator serves every array of up to 8 bytes from one shared block of managed
memory (its small pool), which the CPU writes whenever it makes a scalar. On the H200 a kernel's
first read of such an array waited 3.5-4.5 µs (the phase traces of `bench/phase_trace.py`:
`seq_lens` of one sequence, against 0.4-0.7 µs from an ordinary buffer at batch 4 and up), and
every threadgroup of the decode kernel makes that read before it can start its copies. So the
attention scale and window are made once, on the GPU, in a buffer of their own; and the small
per-step arrays (lengths and block tables of one or two sequences) are views of a padded buffer.
"""

from __future__ import annotations

import functools

import mlx.core as mx
import numpy as np

# Arrays of up to this many bytes come from MLX's small pool (mlx/backend/cuda/allocator.cpp).
SMALL_POOL_BYTES = 8
# Elements of a constant's own buffer: 64 KB, a whole GPU page, so that no CPU write to a
# neighbour moves the page away from the GPU.
CONSTANT_ELEMENTS = 16384
_NUMPY = {mx.int32: np.int32, mx.float32: np.float32}


def input_array(values, dtype: mx.Dtype = mx.int32) -> mx.array:
    """`mx.array(values, dtype)` (int32 or float32), but never in the small pool: when it would
    fit there, a view of the front of a padded buffer, with the same shape, strides and data."""
    array = np.asarray(values, dtype=_NUMPY[dtype])
    buffer = padded(array)
    if buffer is array:
        return mx.array(array)
    return mx.array(buffer)[: array.size].reshape(array.shape)


def padded(array: np.ndarray) -> np.ndarray:
    """`array` itself when it is larger than the small pool's blocks, else its elements at the
    front of a flat zero buffer that is."""
    if array.nbytes > SMALL_POOL_BYTES:
        return array
    buffer = np.zeros(2 * SMALL_POOL_BYTES // array.itemsize, dtype=array.dtype)
    buffer[: array.size] = array.ravel()
    return buffer


@functools.lru_cache(maxsize=64)
def constant(value, dtype: mx.Dtype, backend: str) -> mx.array:
    """A shape-(1,) input holding `value`, made once per value. On CUDA a fill on the GPU (so its
    page starts where the kernels read it) of a buffer of its own; elsewhere a plain array
    (Metal's unified memory has no small pool, and keeps inputs this small in constant memory)."""
    if backend == "cuda":
        array = mx.full((CONSTANT_ELEMENTS,), value, dtype=dtype)[:1]
    else:
        array = mx.array([value], dtype=dtype)
    mx.eval(array)
    return array
