"""When each threadgroup of the fused decode kernel starts, sees its first K/V, finishes its
loop and its tail, and on which SM: the `tr` variant's trace (CUDA), summarised.

    python3 -m mlx_paged.bench.phase_trace BATCH CONTEXT [VARIANT] [PARTITION]

VARIANT is a `tr` spec suffix (default `mma_s3_tr_fused`), PARTITION the split-K length
(default 1024; 0 for the single pass, with a variant without `fused`, e.g. `mma_s3_tr`). The
shape is the kernel benchmark's (32/8 heads, head_dim 128, bf16, blocks of 16, shuffled
pages). It checks the output against MLX's SDPA, then prints each phase's median
length, how busy the SMs were streaming K/V, and a coarse timeline of how many threadgroups
were in each phase: of a call alone on the GPU, and (fused variants) of the last of
BACK_TO_BACK calls queued together.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np

from mlx_paged.codegen.spec import KernelSpec
from mlx_paged.kernels.counter_chain import CounterChain
from mlx_paged.kernels.kernel_inputs import constant
from mlx_paged.kernels.paged_attention_plan import launch_plan

# Columns of a trace row (see _trace.jinja).
SM, START, LANDED, LOOPED, COUNTED, END, STEPS, MERGED, LENGTH, ISSUED = range(10)
COLUMNS = 10
BACK_TO_BACK = 8


def traced_call(queries, k_pages, v_pages, tables, lens, scale: float,
                variant: str = "mma_s3_tr_fused", partition: int = 1024,
                chain: CounterChain | None = None, evaluate: bool = True):
    """One call of a `tr` variant, evaluated: (output, trace rows, int64 `(rows, COLUMNS)`).
    `partition` 0 runs the single pass (then `variant` must not be `fused`). Keep the trace
    alive while tracing more calls: MLX would recycle its buffer, which the CPU has read.
    A fused call counts on `chain` (default: a fresh one); `evaluate=False` leaves the call
    lazy, so several can run back to back, ordered by their shared chain."""
    num_seqs, num_heads, num_queries, head_dim = queries.shape
    _, block_size, num_kv_heads, _ = k_pages.shape
    if not KernelSpec.parse_tuning(variant).get("phase_trace"):
        raise ValueError(f"{variant}: the trace needs a `tr` variant")
    # The launcher's own plan (grid, partials), with the trace as one more output.
    plan = launch_plan("cuda", queries.dtype, num_seqs, num_heads, num_queries, head_dim,
                       block_size, num_kv_heads, tables.shape[1], False, partition or None,
                       not partition, variant, traced=True)
    rows = (plan.grid[0] // plan.threadgroup[0]) * plan.grid[1] * plan.grid[2]
    inputs = [queries, k_pages, v_pages, tables, lens, constant(scale, mx.float32, "cuda")]
    partial_dtypes = [mx.float32] * len(plan.partial_shapes)

    def launch(counters=None):
        extra = [] if counters is None else [counters]
        return plan.kernel(
            inputs=inputs + extra, template=[("T", queries.dtype)], grid=plan.grid,
            threadgroup=plan.threadgroup,
            output_shapes=[queries.shape, *plan.partial_shapes, (rows, COLUMNS)]
            + [c.shape for c in extra],
            output_dtypes=[queries.dtype, *partial_dtypes, mx.int64]
            + [mx.int32] * len(extra))
    outputs = (chain or CounterChain()).call(plan.counter_slots, launch) if plan.fused else launch()
    if evaluate:
        mx.eval(outputs)
    return outputs[0], outputs[len(plan.partial_shapes) + 1]


def summary(trace: np.ndarray, bins: int = 20) -> str:
    """Phase lengths, SM streaming time and a timeline of a trace (rows of COLUMNS)."""
    live = trace[trace[:, START] > 0]
    if not len(live):
        raise ValueError("no threadgroup ran: every row is empty")
    t0 = live[:, START].min()
    span = live[:, END].max() - t0
    us = lambda a: a / 1e3  # noqa: E731 - ns to µs
    start, landed, looped = live[:, START] - t0, live[:, LANDED] - t0, live[:, LOOPED] - t0
    counted, end = live[:, COUNTED] - t0, live[:, END] - t0
    merged = live[:, MERGED] == 1
    out = [f"{len(live)} threadgroups ({len(trace) - len(live)} empty) on "
           f"{len(np.unique(live[:, SM]))} SMs, {us(span):.1f} µs from the first start to the "
           f"last end; warp 0 ran {int(np.median(live[:, STEPS]))} steps (median)"]
    phases = (("start to first K/V", landed - start), ("loop", looped - landed),
              ("partials + count", counted - looped), ("merge (last partition)",
                                                        (end - counted)[merged]))
    out.append("median µs: " + ", ".join(f"{name} {us(np.median(d)):.2f}"
                                            for name, d in phases if len(d)))
    # The start, split at its dependent loads: seq_lens, then the block ids (whose copies then
    # issue), then the copies themselves.
    length, issued = live[:, LENGTH] - t0, live[:, ISSUED] - t0
    out.append("  of the start: " + ", ".join(
        f"{name} {us(np.median(d)):.2f}" for name, d in (
            ("to the length", length - start), ("to the first copies issued", issued - length),
            ("to their landing", landed - issued))))
    # Per SM: the time some threadgroup on it was inside its loop (streaming K/V).
    streaming = []
    for sm in np.unique(live[:, SM]):
        mine = live[:, SM] == sm
        spans = sorted(zip(landed[mine], looped[mine]))
        covered, until = 0, -1
        for a, b in spans:
            a = max(a, until)
            if b > a:
                covered += b - a
                until = b
        streaming.append(covered / span)
    out.append(f"SM time with a threadgroup in its loop: median {np.median(streaming):.0%}, "
               f"min {min(streaming):.0%}")
    out.append(f"timeline ({bins} bins of {us(span) / bins:.1f} µs): threadgroups starting "
               f"(before first K/V) / in the loop / in the tail, on average over the bin")
    edges = np.linspace(0, span, bins + 1)
    for lo, hi in zip(edges[:-1], edges[1:]):
        def inside(a, b):
            return np.clip(np.minimum(b, hi) - np.maximum(a, lo), 0, None).sum() / (hi - lo)
        out.append(f"  {us(lo):8.1f} µs  {inside(start, landed):6.1f} {inside(landed, looped):6.1f}"
                   f" {inside(looped, end):6.1f}")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from mlx_paged.bench.problems import contiguous_kv, standard_problem
    batch, context = int(argv[0]), int(argv[1])
    variant = argv[2] if len(argv) > 2 else "mma_s3_tr_fused"
    partition = int(argv[3]) if len(argv) > 3 else 1024
    q, k_pages, v_pages, tables, lens = standard_problem(batch, context)
    traces = []  # all alive, so no call writes its trace into a buffer the CPU has read
    for _ in range(3):  # compile, then warm
        out, trace = traced_call(q, k_pages, v_pages, tables, lens, 0.088, variant, partition)
        traces.append(trace)
    k, v = contiguous_kv(k_pages, v_pages, tables, context)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088)
    diff = mx.max(mx.abs(out.astype(mx.float32) - ref.astype(mx.float32))).item()
    print(f"B={batch} T={context} {variant} p{partition}: max abs diff vs MLX SDPA {diff:.4f}")
    print(summary(np.array(traces[-1])))
    if "fused" in variant.split("_"):
        # As in a decode step or the chained benchmark: the GPU busy with the previous call.
        chain = CounterChain()
        calls = [traced_call(q, k_pages, v_pages, tables, lens, 0.088, variant, partition,
                             chain, evaluate=False) for _ in range(BACK_TO_BACK)]
        mx.eval(calls)
        traces.extend(trace for _, trace in calls)
        print(f"the last of {BACK_TO_BACK} calls back to back (ordered by their counters):")
        print(summary(np.array(calls[-1][1])))
    return 0 if diff <= 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
