"""Host time per decode-attention call, next to MLX's SDPA and two trivial custom kernels.

    python3 -m mlx_paged.bench.host_cost [BATCH CONTEXT]

For each method, 1000 chained calls (each call's output is the next call's queries): `build`
is the host time per call to add it to MLX's graph, with no evaluation; `eval` is the time
per call to then evaluate them all. Peers: MLX's SDPA on the same K/V made contiguous, a
one-line `mx.fast.cuda_kernel` (`tiny`), and the same with 18 KB of comment lines in its
source (`big_src`: MLX rebuilds a custom kernel's source text on every call); `wide` and
`wide_big_src` are near-empty kernels with the routed kernel's arguments (7 inputs, the
shapes and strides it reads, 3 outputs), so that `paged_eager` - `wide_big_src` is the launcher's
own share, `wide` - `tiny` the arguments' and `big_src` - `tiny` the source text's. The shape is
the kernel benchmark's (32 query / 8 KV heads, head_dim 128, bf16, blocks of 16, a 4 GiB pool
with shuffled block ids); default 1 × 2048. `paged` is the launcher as the engine calls it (its
kernel nodes replayed by `mx.compile`), `paged_eager` the same kernels built anew on every call.
Needs MLX on a CUDA GPU.
"""

from __future__ import annotations

import sys
import time

import mlx.core as mx

from mlx_paged.bench.problems import contiguous_kv, standard_problem
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode

CALLS = 1000


def per_call_us(fn, queries: mx.array, calls: int = CALLS) -> tuple[float, float]:
    """(build, eval) µs per call of `calls` chained calls of `fn`."""
    x = queries
    tic = time.perf_counter()
    for _ in range(calls):
        x = fn(x)
    build = time.perf_counter() - tic
    tic = time.perf_counter()
    mx.eval(x)
    mx.synchronize()
    return build / calls * 1e6, (time.perf_counter() - tic) / calls * 1e6


def _copy_kernel(name: str, padding_lines: int):
    source = "out[threadIdx.x] = inp[threadIdx.x];\n" + "// padding\n" * padding_lines
    kernel = mx.fast.cuda_kernel(
        name=name, input_names=["inp"], output_names=["out"], source=source
    )
    return lambda x: kernel(
        inputs=[x],
        grid=(32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[x.shape],
        output_dtypes=[x.dtype],
    )[0]


def _wide_kernel(name: str, padding_lines: int, k_pages, v_pages, tables, lens):
    """A near-empty kernel taking the routed fused kernel's inputs and outputs."""
    source = (
        "if (threadIdx.x == 0 && blockIdx.x == 0) {\n"
        "  out[0] = queries[0];\n"
        "  partials[0] = float(queries_strides[0] + k_pages_strides[0] + "
        "v_pages_strides[0] + block_tables_strides[0] + k_pages_shape[0] + "
        "block_tables_shape[1] + seq_lens_shape[0] + counters_shape[0]);\n"
        "  partials[1] = scale[0] + float(seq_lens[0]);\n"
        "  counters_next[0] = counters[0] + block_tables[0];\n}\n" + "// padding\n" * padding_lines
    )
    kernel = mx.fast.cuda_kernel(
        name=name,
        input_names=[
            "queries",
            "k_pages",
            "v_pages",
            "block_tables",
            "seq_lens",
            "scale",
            "counters",
        ],
        output_names=["out", "partials", "counters_next"],
        source=source,
        ensure_row_contiguous=False,
    )
    scale = mx.array([0.088], dtype=mx.float32)
    counters = mx.zeros((256,), dtype=mx.int32)
    mx.eval(scale, counters)

    def call(x):
        return kernel(
            inputs=[x, k_pages, v_pages, tables, lens, scale, counters],
            template=[("T", x.dtype)],
            grid=(128, 1, 1),
            threadgroup=(128, 1, 1),
            output_shapes=[x.shape, (2,), counters.shape],
            output_dtypes=[x.dtype, mx.float32, mx.int32],
        )[0]

    return call


def main(argv: list[str]) -> int:
    if current_backend() != "cuda":
        print(
            "python3 -m mlx_paged.bench.host_cost needs MLX on a CUDA GPU; this machine runs "
            f"MLX on {mx.default_device()}"
        )
        return 2
    batch, context = (int(argv[0]), int(argv[1])) if len(argv) >= 2 else (1, 2048)
    queries, k_pages, v_pages, tables, lens = standard_problem(batch, context)
    k, v = contiguous_kv(k_pages, v_pages, tables, context)
    mx.eval(k, v)
    methods = {
        "paged": lambda x: paged_attention_decode(x, k_pages, v_pages, tables, lens, scale=0.088),
        "paged_eager": lambda x: paged_attention_decode(
            x, k_pages, v_pages, tables, lens, scale=0.088, compiled=False
        ),
        "sdpa": lambda x: mx.fast.scaled_dot_product_attention(x, k, v, scale=0.088),
        "tiny": _copy_kernel("host_cost_tiny", 0),
        "big_src": _copy_kernel("host_cost_big", 1500),
        "wide": _wide_kernel("host_cost_wide", 0, k_pages, v_pages, tables, lens),
        "wide_big_src": _wide_kernel("host_cost_wide_big", 1500, k_pages, v_pages, tables, lens),
    }
    print(f"B={batch} T={context}: build / eval µs per call of {CALLS} chained calls, twice")
    for name, fn in methods.items():
        per_call_us(fn, queries, 50)  # compile and warm up
        runs = [per_call_us(fn, queries) for _ in range(2)]
        print(f"{name:12s} " + "  ".join(f"{b:6.1f} / {e:6.1f}" for b, e in runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
