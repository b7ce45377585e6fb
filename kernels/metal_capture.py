"""The complete Metal source MLX generates for a kernel spec, captured on any machine.

`mx.fast.metal_kernel` refuses to run without Metal, except while `mx.export_function` traces a
function; called there with `verbose=True`, MLX prints the full MSL it would compile (signature,
attribute arguments, body, explicit instantiation). That text is what golden files pin down.
"""

from __future__ import annotations

import os
import re
import tempfile

import mlx.core as mx

from . import gated_delta, latent_attention, layer_kernels, quantize_rows
from .gated_delta import GatedDeltaSpec
from .kernel_spec import KernelSpec
from .latent_attention import LatentSpec
from .layer_kernels import LayerKernelSpec
from .paged_attention_geometry import build, define
from .quantize_rows import QuantizeRowsSpec
from .quantized_pages import QuantizedKVPages

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}
# A representative call: 8 sequences (so per-sequence inputs live in device memory, not in
# Metal's constant space, which MLX picks for inputs under 8 elements), 2 KV heads, 4 pages each.
CAPTURE_SEQS, CAPTURE_KV_HEADS, CAPTURE_PAGES = 8, 2, 4


def sample_inputs(spec: KernelSpec) -> tuple[list[mx.array], list, list]:
    """(inputs, output_shapes, output_dtypes) of the representative call of `spec`."""
    dtype = _DTYPES[spec.dtype]
    seqs, kv_heads, heads = CAPTURE_SEQS, CAPTURE_KV_HEADS, CAPTURE_KV_HEADS * spec.gqa
    window = [mx.array([64], dtype=mx.int32)] if spec.sliding_window or spec.chunked else []
    seq_lens = mx.full((seqs,), spec.block_size * CAPTURE_PAGES, dtype=mx.int32)
    parts = 2
    if spec.is_reduce:
        inputs = [
            mx.zeros((seqs, heads, parts, spec.v_dim)),
            mx.zeros((seqs, heads, parts)),
            mx.zeros((seqs, heads, parts)),
            seq_lens,
        ] + window
        return inputs, [(seqs, heads, 1, spec.v_dim)], [dtype]
    page_shape = (seqs * CAPTURE_PAGES, spec.block_size, kv_heads, spec.head_dim)
    if spec.quantized:  # K and V share one array of rows
        kv = QuantizedKVPages.zeros(page_shape, dtype, spec.k_bits, spec.v_bits, spec.group_size)
        pages = [kv.rows]
    else:
        rows = (page_shape[0] * page_shape[1], kv_heads)  # 16-bit pages: flat rows
        pages = [mx.zeros((*rows, spec.head_dim), dtype), mx.zeros((*rows, spec.v_dim), dtype)]
    inputs = [
        mx.zeros((seqs, heads, 1, spec.head_dim), dtype),
        *pages,
        mx.zeros((seqs, CAPTURE_PAGES), mx.int32),
        seq_lens,
        mx.array([1.0], dtype=mx.float32),
    ] + window
    if spec.softcap:
        inputs.append(mx.array([50.0], dtype=mx.float32))
    new_token = (seqs, kv_heads, 1, spec.head_dim)
    if spec.rope:
        inputs += [mx.zeros(new_token, dtype), mx.zeros(new_token, dtype)]
        inputs.append(mx.ones((spec.head_dim // 2,), mx.float32))
    rotated = ([new_token], [dtype]) if spec.rope else ([], [])
    if spec.partitioned:
        shapes = [(seqs, heads, parts, spec.v_dim), (seqs, heads, parts), (seqs, heads, parts)]
        return inputs, shapes + rotated[0], [mx.float32] * 3 + rotated[1]
    return inputs, [(seqs, heads, 1, spec.v_dim)] + rotated[0], [dtype] + rotated[1]


def _gated_delta_call(spec: GatedDeltaSpec) -> tuple[int, list, list, list]:
    """(threads, inputs, output shapes, output dtypes) of a 4-token call of `spec` (one token
    for a decode step)."""
    dtype, seqs, steps = _DTYPES[spec.dtype], CAPTURE_SEQS, 4
    qk = (seqs, steps, spec.key_heads, spec.key_dim)
    state = (seqs, spec.value_heads, spec.value_dim, spec.key_dim)
    if spec.conv_size:
        return _gated_delta_step_call(spec, dtype, state)
    inputs = [
        mx.zeros(qk, dtype),
        mx.zeros(qk, dtype),
        mx.zeros((seqs, steps, spec.value_heads, spec.value_dim), dtype),
        mx.zeros((seqs, steps, spec.value_heads), mx.float32),
        mx.zeros((seqs, steps, spec.value_heads), dtype),
        mx.zeros(state, mx.float32),
    ]
    shapes = [(seqs, steps, spec.value_heads, spec.value_dim), state]
    return 32 * spec.rows_per_threadgroup, inputs, shapes, [dtype, mx.float32]


def _gated_delta_step_call(spec: GatedDeltaSpec, dtype, state) -> tuple[int, list, list, list]:
    seqs, heads = CAPTURE_SEQS, spec.value_heads
    channels = 2 * spec.key_heads * spec.key_dim + heads * spec.value_dim
    conv = (seqs, spec.conv_size - 1, channels)
    inputs = [
        mx.zeros((seqs, 1, channels), dtype),
        mx.zeros(conv, dtype),
        mx.zeros((channels, spec.conv_size, 1), dtype),
        mx.zeros((seqs, 1, heads), dtype),
        mx.zeros((seqs, 1, heads), dtype),
        mx.zeros((heads,), mx.float32),
        mx.zeros((heads,), dtype),
        mx.zeros(state, mx.float32),
    ]
    shapes = [(seqs, 1, heads, spec.value_dim), state, conv]
    return 32 * spec.rows_per_threadgroup, inputs, shapes, [dtype, mx.float32, dtype]


def _latent_call(spec: LatentSpec) -> tuple[int, list, list, list]:
    """(threads, inputs, output shapes, output dtypes) of a latent-attention kernel's call:
    16 heads over 2 partitions of pages."""
    dtype, seqs, heads, parts = _DTYPES[spec.dtype], CAPTURE_SEQS, 16, 2
    seq_lens = mx.full((seqs,), 1000, dtype=mx.int32)
    if spec.kernel == "reduce":
        partials = [mx.zeros((seqs, heads, parts, spec.latent_dim))]
        partials += [mx.zeros((seqs, heads, parts))] * 2
        return 32, partials + [seq_lens], [(seqs, heads, spec.latent_dim)], [dtype]
    pages = seqs * CAPTURE_PAGES
    inputs = [
        mx.zeros((seqs, heads, 1, spec.latent_dim + spec.rope_dim), dtype),
        mx.zeros((pages, spec.block_size, 1, spec.latent_dim), dtype),
        mx.zeros((pages, spec.block_size, 1, spec.rope_dim), dtype),
        mx.zeros((seqs, CAPTURE_PAGES), mx.int32),
        seq_lens,
        mx.ones((1,), mx.float32),
    ]
    shapes = [(seqs, heads, parts, spec.latent_dim), (seqs, heads, parts), (seqs, heads, parts)]
    return latent_attention.THREADS, inputs, shapes, [mx.float32] * 3


def capture_metal_source(spec, kernel=None) -> str:
    """The MSL MLX generates for `spec` (a Metal `KernelSpec`, `QuantizeRowsSpec`,
    `GatedDeltaSpec`, `LatentSpec` or `LayerKernelSpec`) on its representative call; `kernel`
    replaces the spec's own kernel object (tests capture deliberately broken bodies this way)."""
    if spec.backend != "metal":
        raise ValueError(f"{spec.name}: only Metal sources are captured this way")
    if isinstance(spec, GatedDeltaSpec):
        kernel = kernel if kernel is not None else gated_delta.build(spec)
        threads, inputs, shapes, dtypes = _gated_delta_call(spec)
        grid = (spec.value_dim * 32, CAPTURE_SEQS * spec.value_heads, 1)
    elif isinstance(spec, LatentSpec):
        kernel = kernel if kernel is not None else latent_attention.build(spec)
        threads, inputs, shapes, dtypes = _latent_call(spec)
        grid = (threads, CAPTURE_SEQS, 1)
    elif isinstance(spec, LayerKernelSpec):
        kernel = kernel if kernel is not None else layer_kernels.build(spec)
        threads, inputs, shapes, dtypes, grid = layer_kernels.sample_call(spec)
    elif isinstance(spec, QuantizeRowsSpec):
        kernel = kernel if kernel is not None else quantize_rows.build(spec)
        threads, inputs = (
            32,
            [mx.zeros((4, CAPTURE_KV_HEADS, spec.head_dim), _DTYPES[spec.dtype])] * 2,
        )
        shapes, dtypes = [(4, CAPTURE_KV_HEADS, spec.row_layout.row_bytes // 4)], [mx.uint32]
        grid = (4 * CAPTURE_KV_HEADS * threads, 1, 1)
    else:
        kernel = kernel if kernel is not None else build(spec)
        threads = define(spec).threads_per_threadgroup
        inputs, shapes, dtypes = sample_inputs(spec)
        grid = (2 * threads, CAPTURE_SEQS, 1)

    def call(*args):
        return kernel(
            inputs=list(args),
            output_shapes=shapes,
            output_dtypes=dtypes,
            grid=grid,
            threadgroup=(threads, 1, 1),
            template=[("T", _DTYPES[spec.dtype])],
            verbose=True,
        )

    with tempfile.TemporaryDirectory() as tmp:
        printed = os.path.join(tmp, "stdout.txt")
        # MLX prints from C++, so the capture swaps the process-level stdout file descriptor.
        saved = os.dup(1)
        try:
            with open(printed, "w") as sink:
                os.dup2(sink.fileno(), 1)
                mx.export_function(os.path.join(tmp, "k.mlxfn"), call, *inputs)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        text = open(printed).read()
    match = re.search(r"Generated source code for `[^`]*`:\n```\n(.*?)\n```", text, re.S)
    if match is None:
        raise RuntimeError(f"{spec.name}: MLX printed no Metal source:\n{text[:2000]}")
    return match.group(1) + "\n"
