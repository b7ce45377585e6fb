"""Every kernel variant the project generates, and a small set that covers each value once."""

from __future__ import annotations

import itertools

from .spec import (BLOCK_SIZES, DTYPES, GQA_GROUPS, HEAD_DIMS, OPS, PARTITION_SIZES,
                   KernelSpec)


def all_specs(backend: str) -> list[KernelSpec]:
    """All variants for `backend`, in a stable order (the reduce pass only where partitioned)."""
    specs = []
    for op, dtype, hd, bs, g, p, sw in itertools.product(
            OPS, DTYPES, HEAD_DIMS, BLOCK_SIZES, GQA_GROUPS, PARTITION_SIZES, (False, True)):
        if op == "paged_decode_reduce" and p == 0:
            continue
        if p and p % bs:
            continue
        specs.append(KernelSpec(op, backend, dtype, hd, bs, g, p, sw))
    return specs


def representative_specs(backend: str) -> list[KernelSpec]:
    """A few dozen variants in which every dtype, head_dim, block_size, GQA group, partition
    size and window flag appears; golden files keep their full text."""
    specs = []
    for i, (dtype, hd) in enumerate(itertools.product(DTYPES, HEAD_DIMS)):
        g = GQA_GROUPS[i % len(GQA_GROUPS)]
        bs = BLOCK_SIZES[i % len(BLOCK_SIZES)]
        p = PARTITION_SIZES[i % len(PARTITION_SIZES)]
        sw = i % 2 == 1
        specs.append(KernelSpec("paged_decode", backend, dtype, hd, bs, g, p, sw))
        if p:
            specs.append(KernelSpec("paged_decode_reduce", backend, dtype, hd, bs, g, p, sw))
    specs.append(KernelSpec("paged_decode", backend, "bfloat16", 256, 16, 8, 512, False))
    specs.append(KernelSpec("paged_decode", backend, "bfloat16", 128, 16, 4, 512, False))
    specs.append(KernelSpec("paged_decode", backend, "bfloat16", 128, 16, 4, 0, False))
    return specs
