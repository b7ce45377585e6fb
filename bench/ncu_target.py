"""A few calls of one decode kernel (or of `paged_read`) at one shape, for Nsight Compute.

    ncu --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        --section SchedulerStats --section LaunchStats --section MemoryWorkloadAnalysis \\
        -k regex:paged --launch-skip 2 --launch-count 1 \\
        python3 -m mlx_paged.bench.ncu_target BATCH CONTEXT [KERNEL|read|sdpa|-] [PARTITION|-] \\
        [BITS/GROUP]

The shape is the kernel benchmark's (32 query / 8 KV heads, head_dim 128, bf16, blocks of 16,
a 4 GiB pool with shuffled block ids). KERNEL names one of `KERNELS` ("-" the routed one),
"read" the paged-read ceiling, "sdpa" MLX's SDPA on the same K/V made contiguous (use
`-k regex:sdpa`); PARTITION is a split kernel's partition length ("-": the routed one);
BITS/GROUP (e.g. 4/32) quantizes the pages the kernels read (`QuantizedKVPages`).
KERNEL `latentH` runs the routed MLA decode instead (both passes, `-k regex:latent`): H query
heads over DeepSeek's latent rows (512 + 64, bf16, the `--latent-dims` benchmark's pool), at
PARTITION tokens a pass-1 threadgroup ("-": `partition_for` the shape).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import mlx.core as mx

from mlx_paged.bench.latent_kernels import latent_problem
from mlx_paged.bench.paged_read import paged_read
from mlx_paged.bench.problems import contiguous_kv, standard_problem
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.latent_attention import latent_attention_decode
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode
from mlx_paged.kernels.quantized_pages import QuantizedKVPages


def main(argv: list[str], pool_bytes: int = 4 << 30) -> None:
    """Run the calls `argv` asks for (see the module docstring) on a pool of `pool_bytes`."""
    batch, context = int(argv[0]), int(argv[1])
    kernel = argv[2] if len(argv) > 2 and argv[2] != "-" else None
    partition = int(argv[3]) if len(argv) > 3 and argv[3] != "-" else None
    if kernel and kernel.startswith("latent"):
        heads = int(kernel.removeprefix("latent"))
        return latent_calls(batch, context, heads, partition, pool_bytes)
    queries, k_pages, v_pages, tables, lens = standard_problem(batch, context, pool_bytes)
    if len(argv) > 4:
        if kernel in ("read", "sdpa"):
            raise ValueError(f"{kernel} reads 16-bit K/V; BITS/GROUP is for the decode kernels")
        bits, group = (int(x) for x in argv[4].split("/"))
        kv = QuantizedKVPages.from_values(k_pages, v_pages, bits, bits, group)
        k_pages, v_pages = kv.k, kv.v
    if kernel == "sdpa":
        k, v = contiguous_kv(k_pages, v_pages, tables, context)
    for _ in range(3):
        if kernel == "sdpa":
            mx.eval(mx.fast.scaled_dot_product_attention(queries, k, v, scale=0.088))
        elif kernel == "read":
            mx.eval(paged_read(k_pages, v_pages, tables, lens))
        else:
            mx.eval(
                paged_attention_decode(
                    queries,
                    k_pages,
                    v_pages,
                    tables,
                    lens,
                    scale=0.088,
                    kernel=kernel,
                    partition_size=partition,
                )
            )
    mx.synchronize()


def latent_calls(batch: int, context: int, heads: int, partition: int | None,
                 pool_bytes: int) -> None:  # fmt: skip
    """A few routed MLA decode calls (`latentH`) on a shuffled pool of latent pages."""
    backend = current_backend()
    if backend is None:
        raise UnsupportedSpecError(
            f"MLA decode kernels run on Metal or CUDA, not {mx.default_device()}"
        )
    args = SimpleNamespace(latent_dims=(512, 64), dtype="bfloat16", block_size=16,
                           num_heads=heads, pool_gb=pool_bytes / 2**30)  # fmt: skip
    p = latent_problem(batch, context, args)
    for _ in range(3):
        mx.eval(latent_attention_decode(*p["q"], *p["pages"], p["tables"], p["lens"],
                                        scale=p["scale"], backend=backend,
                                        partition_size=partition))  # fmt: skip
    mx.synchronize()


if __name__ == "__main__":
    main(sys.argv[1:])
