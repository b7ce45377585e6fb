"""Small kernel inputs kept out of MLX's CUDA small pool (`kernels/kernel_inputs.py`)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.kernel_inputs import SMALL_POOL_BYTES, constant, input_array, padded


def test_small_arrays_live_at_the_front_of_a_larger_buffer():
    for values in ([7], [[1, 2]], [-3, 4]):
        array = np.asarray(values, dtype=np.int32)
        buffer = padded(array)
        assert array.nbytes <= SMALL_POOL_BYTES < buffer.nbytes
        assert buffer[: array.size].tolist() == array.ravel().tolist()
        assert not buffer[array.size :].any()
    big = np.arange(3, dtype=np.int32)
    assert padded(big) is big


def test_input_array_keeps_shape_dtype_and_values():
    for values, dtype in (
        ([5], mx.int32),
        ([[1, 2]], mx.int32),
        ([1, 2, 3], mx.int32),
        ([[1, 2, 3], [4, 5, 6]], mx.int32),
        ([0.5], mx.float32),
        ([], mx.int32),
    ):
        array = input_array(values, dtype)
        assert array.dtype == dtype
        assert array.shape == np.asarray(values).shape
        assert array.tolist() == values


def test_constant_is_made_once_per_value():
    for backend in ("cuda", "metal"):
        scale = constant(0.125, mx.float32, backend)
        assert scale.shape == (1,) and scale.tolist() == [0.125]
        assert constant(0.125, mx.float32, backend) is scale
    assert constant(4, mx.int32, "cuda").tolist() == [4]
