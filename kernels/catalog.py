"""Every kernel spec the project generates, and a small set in which each kernel and each
dtype, head size, block size, GQA group and window flag appears."""

from __future__ import annotations

import itertools

from .kernel_spec import (
    BLOCK_SIZES,
    DTYPES,
    GQA_GROUPS,
    HEAD_DIMS,
    KERNELS,
    QUANT_HEAD_DIMS,
    KernelSpec,
    UnsupportedSpecError,
)
from .quantized_pages import KV_GROUP_SIZES


def all_specs(backend: str) -> list[KernelSpec]:
    """All specs for `backend`, in a stable order: each kernel, then its `decode_rope_*` form."""
    specs = []
    for name, rope, dtype, hd, bs, g, sw in itertools.product(
        KERNELS, (False, True), DTYPES, HEAD_DIMS, BLOCK_SIZES, GQA_GROUPS, (False, True)
    ):
        for size in KERNELS[name].partition_sizes or (0,):
            try:
                specs.append(KernelSpec(name, backend, dtype, hd, bs, g, size, sw, rope))
            except UnsupportedSpecError:
                pass  # e.g. tensor cores on Metal or with fp32 pages, RoPE in the reduce
    return specs


def representative_specs(backend: str) -> list[KernelSpec]:
    """About two dozen specs that cover every kernel of `backend`, with and without RoPE, and
    every value of each field once or more; the golden Metal files keep the Metal ones' full
    text."""
    specs = []
    for i, (dtype, hd) in enumerate(itertools.product(DTYPES, HEAD_DIMS)):
        name = ("decode_simt", "decode_simt_splitk", "decode_reduce")[i % 3]
        specs.append(
            KernelSpec(
                name,
                backend,
                dtype,
                hd,
                BLOCK_SIZES[i % len(BLOCK_SIZES)],
                GQA_GROUPS[i % len(GQA_GROUPS)],
                KERNELS[name].partition_sizes[0] if i % 3 else 0,
                i % 2 == 1,
                rope=name != "decode_reduce" and i % 4 == 1,
            )
        )
    if backend == "cuda":
        for i, name in enumerate(
            ("decode_tc", "decode_tc_wide", "decode_tc_splitk", "decode_tc_splitk_direct")
        ):
            size = KERNELS[name].partition_sizes[-1] if KERNELS[name].partition_sizes else 0
            specs.append(
                KernelSpec(
                    name,
                    backend,
                    ("bfloat16", "float16")[i % 2],
                    (128, 64)[i // 2 % 2],
                    (16, 32)[i % 2],
                    (4, 8)[i % 2],
                    size,
                    i == 1,
                    rope=i % 2 == 0,
                )
            )
    return specs


def value_dim_specs(backend: str) -> list[KernelSpec]:
    """SIMT specs whose V heads have a size of their own (expanded MLA's K 192 / V 128 among
    them), over every pass, dtype, a window and GQA 1-8."""
    cases = [
        ("decode_simt", "bfloat16", 192, 128, 16, 1, False),
        ("decode_simt_splitk", "float16", 192, 128, 16, 4, True),
        ("decode_reduce", "float16", 192, 128, 16, 4, True),
        ("decode_simt", "float32", 128, 64, 8, 2, False),
        ("decode_simt_splitk", "bfloat16", 192, 128, 32, 8, False),
        ("decode_reduce", "bfloat16", 192, 128, 32, 8, False),
        ("decode_simt", "float16", 64, 128, 16, 3, False),
    ]
    return [
        KernelSpec(name, backend, dtype, hd, bs, g, KERNELS[name].partition_sizes[0]
                   if KERNELS[name].partition_sizes else 0, sw, value_dim=dv)
        for name, dtype, hd, dv, bs, g, sw in cases
    ]  # fmt: skip


def score_rule_specs(backend: str) -> list[KernelSpec]:
    """SIMT specs with soft-capped scores (gemma2: with and without its sliding window, on
    16-bit and quantized pages) or chunked attention (llama4), over every pass and dtype."""
    cases = [
        ("decode_simt", "bfloat16", 256, 16, 2, True, False, True, (16, 16, 0)),
        ("decode_simt_splitk", "float16", 128, 16, 2, False, False, True, (16, 16, 0)),
        ("decode_simt", "float32", 64, 8, 1, False, False, True, (8, 4, 32)),
        ("decode_simt", "bfloat16", 128, 16, 5, False, True, False, (16, 16, 0)),
        ("decode_simt_splitk", "bfloat16", 128, 32, 5, False, True, False, (16, 16, 0)),
        ("decode_reduce", "bfloat16", 128, 32, 5, False, True, False, (16, 16, 0)),
    ]
    return [
        KernelSpec(name, backend, dtype, hd, bs, g, KERNELS[name].partition_sizes[0]
                   if KERNELS[name].partition_sizes else 0, sw, False, *bits, chunked=ck,
                   softcap=sc)
        for name, dtype, hd, bs, g, sw, ck, sc, bits in cases
    ]  # fmt: skip


def quantized_specs(backend: str) -> list[KernelSpec]:
    """A dozen dequantizing specs (SIMT kernels on quantized pages) in which each K/V bits pair,
    group size, quantized head size, dtype, block size and window flag appears; on CUDA, also
    the register-path tensor-core kernel (`decode_tc_splitk_direct`) in five of them."""
    pairs = [(8, 8), (4, 4), (8, 4), (4, 8), (16, 4), (8, 16)]
    specs = []
    for i, (k_bits, v_bits) in enumerate(pairs * 2):
        name = ("decode_simt", "decode_simt_splitk")[i % 2]
        specs.append(
            KernelSpec(
                name,
                backend,
                DTYPES[i % len(DTYPES)],
                QUANT_HEAD_DIMS[i % len(QUANT_HEAD_DIMS)],
                BLOCK_SIZES[i % len(BLOCK_SIZES)],
                GQA_GROUPS[(3 * i) % len(GQA_GROUPS)],
                KERNELS[name].partition_sizes[0] if i % 2 else 0,
                i % 4 == 3,
                k_bits=k_bits,
                v_bits=v_bits,
                group_size=KV_GROUP_SIZES[i // len(pairs)],
            )
        )
    if backend == "cuda":
        specs += _tensor_core_quantized_specs()
    return specs


def _tensor_core_quantized_specs() -> list[KernelSpec]:
    """The register path (bf16/fp16, head dims 64/128, blocks 16/32, both group sizes, windows,
    K or V at 16 bits) and the quantized ring: each ring kernel, rows copied in 16-byte and in
    8-byte pieces."""
    rings = [
        KernelSpec("decode_tc_splitk", "cuda", "bfloat16", 128, 16, 4, 1024, k_bits=4, v_bits=4,
                   group_size=32),
        KernelSpec("decode_tc", "cuda", "float16", 64, 32, 8, 0, True, k_bits=8, v_bits=4,
                   group_size=32),
        KernelSpec("decode_tc_wide", "cuda", "bfloat16", 128, 32, 2, 0, k_bits=8, v_bits=8,
                   group_size=64),
        # Rows of 72 bytes, copied 8 bytes at a time.
        KernelSpec("decode_tc", "cuda", "float16", 64, 16, 4, 0, k_bits=4, v_bits=4,
                   group_size=64),
        KernelSpec("decode_tc_splitk", "cuda", "float16", 128, 16, 8, 1024, True, k_bits=8,
                   v_bits=8, group_size=32),
    ]  # fmt: skip
    cases = [
        ("bfloat16", 128, 16, 4, False, 4, 4, 32),
        ("float16", 64, 32, 8, True, 8, 4, 64),
        ("bfloat16", 128, 32, 2, False, 8, 8, 64),
        ("float16", 128, 16, 4, True, 16, 4, 32),
        ("bfloat16", 64, 16, 1, False, 8, 16, 32),
    ]
    return [
        KernelSpec(
            "decode_tc_splitk_direct",
            "cuda",
            dtype,
            hd,
            bs,
            g,
            1024,
            sw,
            k_bits=k,
            v_bits=v,
            group_size=group,
        )
        for dtype, hd, bs, g, sw, k, v, group in cases
    ] + rings
