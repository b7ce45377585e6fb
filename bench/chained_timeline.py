"""GPU timeline of chained decode-attention calls: the routed kernel, any forced variants,
then MLX's SDPA.

    python3 -m mlx_paged.bench.chained_timeline BATCH CONTEXT [VARIANT[@PARTITION|@1pass] ...]

Runs 3 × 20 chained calls of each (each call's output is the next call's queries, as in a
model) under PyTorch's CUPTI profiler, which sees the kernels MLX launches in the same process,
and prints per GPU op its count, median duration and median gap after the previous op ended.
Each extra argument adds the kernel forced to a tuning variant: `mma_s3_w8_fused@4096` its
split-K of 4096-token partitions, `mma_s3_w8@1pass` its single pass, a bare variant as the
routing would run it. The shape is the kernel benchmark's (32 query / 8 KV heads, head_dim 128,
bf16, blocks of 16, a 4 GiB pool with shuffled block ids). Needs a CUDA GPU and torch.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

from mlx_paged.bench.problems import contiguous_kv, standard_problem
from mlx_paged.kernels.paged_attention import paged_attention_decode

_GPU_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")


def gpu_ops(trace_path: Path) -> list[tuple[float, float, str]]:
    """(start µs, duration µs, name) of every GPU op in a chrome trace, by start."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    return sorted((e["ts"], e["dur"], e["name"][:60]) for e in events
                  if e.get("ph") == "X" and e.get("cat") in _GPU_CATEGORIES)


def summarize(ops: list[tuple[float, float, str]]) -> dict[str, tuple[int, float, float]]:
    """Per op name: (count, median duration, median gap after the previous op's end), in µs."""
    samples: dict[str, list[tuple[float, float]]] = {}
    previous_end = None
    for start, duration, name in ops:
        gap = start - previous_end if previous_end is not None else 0.0
        samples.setdefault(name, []).append((duration, gap))
        previous_end = start + duration
    return {name: (len(v), statistics.median(d for d, _ in v), statistics.median(g for _, g in v))
            for name, v in samples.items()}


def forced_options(arg: str) -> dict:
    """`paged_attention_decode` options of one extra argument: "VARIANT", "VARIANT@1pass" or
    "VARIANT@PARTITION" (split-K of that partition length)."""
    variant, _, how = arg.partition("@")
    if not how:
        return {"variant": variant}
    if how == "1pass":
        return {"variant": variant, "single_pass": True}
    if not how.isdigit():
        raise ValueError(f"{arg!r}: expected VARIANT, VARIANT@1pass or VARIANT@PARTITION")
    return {"variant": variant, "single_pass": False, "partition_size": int(how)}


def main(argv: list[str]) -> None:
    from torch.profiler import ProfilerActivity, profile

    batch, context = int(argv[0]), int(argv[1])
    queries, k_pages, v_pages, tables, lens = standard_problem(batch, context)
    k, v = contiguous_kv(k_pages, v_pages, tables, context)
    def paged(**options):
        return lambda q: paged_attention_decode(q, k_pages, v_pages, tables, lens, scale=0.088,
                                                **options)
    methods = {"paged": paged()}
    for arg in argv[2:]:
        methods[f"paged_{arg}"] = paged(**forced_options(arg))
    methods["mlx_sdpa"] = lambda q: mx.fast.scaled_dot_product_attention(q, k, v, scale=0.088)
    for fn in methods.values():  # compile outside the profile
        mx.eval(fn(queries))
        mx.synchronize()
    for name, fn in methods.items():
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                out = queries
                for _ in range(20):
                    out = fn(out)
                mx.eval(out)
                mx.synchronize()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            prof.export_chrome_trace(str(path))
            ops = gpu_ops(path)
        print(f"== {name} B={batch} T={context}: {len(ops)} GPU ops over 60 calls")
        for op, (count, duration, gap) in summarize(ops).items():
            print(f"  {count:4d} x  dur med {duration:8.2f} us  gap med {gap:7.2f} us  {op}")


if __name__ == "__main__":
    main(sys.argv[1:])
