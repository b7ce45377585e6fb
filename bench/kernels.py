"""Decode attention over a KV cache: the paged kernel next to its peers, on the same data.

For each (batch, context) shape: a page pool at least `--pool-gb` large (several times the GPU's
cache) with shuffled block ids; the paged kernel (routed, and each `--kernel` forced), MLX's
`scaled_dot_product_attention` on contiguous K/V, gather-then-SDPA (the reference), PyTorch's SDPA
when torch is importable, and the device copy bandwidth measured in the same run. Every method's
output is checked against the paged kernel's, so they all computed the same attention.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from mlx_paged.codegen.build import KernelRenderError
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode
from mlx_paged.kernels.paged_attention_reference import paged_attention_reference
from mlx_paged.kernels.quantized_pages import QuantizedKVPages, layer_bytes_per_token
from mlx_paged.progress import progress

from .kernel_peers import time_peers
from .kernel_plot import plot, print_row
from .latent_kernels import bench_latent_shape
from .output import write_result
from .paged_read import paged_read
from .problems import head_major_view, make_problem
from .timing import (
    copy_bandwidth,
    cuda_torch,
    launch_floor,
    time_mlx,
    time_mlx_chained,
)

_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


PEERS = ("paged_read", "mlx_sdpa", "torch_sdpa")
PLAIN_COLUMN = "paged_16bit"  # quantized sweeps: the routed kernel on the 16-bit pages
# `--pipelined`: chained calls evaluated this many at a time, each batch's evaluation started
# before the next is built (fewer than one decode step's attention calls in small models).
PIPELINE_CALLS = 8


def paged_runs(args) -> dict[str, dict]:
    """Every paged-kernel column of a sweep: its name and its `paged_attention_decode` options
    (the routed kernel as `paged`, each `--kernel` forced as `paged_<kernel>`; on quantized
    pages, also the routed kernel over the same values at 16 bits as `paged_16bit`)."""
    runs = {"paged": {}}
    for kernel in getattr(args, "kernel", []):
        runs[f"paged_{kernel}"] = dict(kernel=kernel)
    if getattr(args, "kv_bits", 16) < 16:
        runs[PLAIN_COLUMN] = {}
    return runs


def method_names(args) -> list[str]:
    """Every column a sweep with these arguments times, before `--skip` (its valid names),
    in table order: the paged columns, the gather reference, the peers."""
    return list(paged_runs(args)) + ["gather_sdpa"] + list(PEERS)


def unknown_skips(args) -> list[str]:
    """The `--skip` names that match no column of this sweep."""
    known = set(method_names(args))
    return [name for name in getattr(args, "skip", []) if name not in known]


@dataclass
class Problem:
    """One shape's inputs, shared by every method."""

    q: mx.array
    k_pages: mx.array
    v_pages: mx.array
    tables: mx.array
    lens: mx.array
    scale: float
    kv_bytes: int  # K and V of every row at 16 bits
    read: tuple  # the pages the paged columns and the reference read: quantized, or the above
    read_bytes: int  # K and V of every row as `read` holds them, scales and biases included


def _problem(batch: int, context: int, args) -> Problem:
    dtype = _DTYPES[args.dtype]
    head_major = getattr(args, "head_major_pages", False)
    bits, group = getattr(args, "kv_bits", 16), getattr(args, "kv_group_size", 32)
    if head_major and bits == 16:
        raise ValueError(
            "--head-major-pages stores quantized rows head-major (give --kv-bits 8 or 4): the "
            "kernels read 16-bit pages as flat token-major rows"
        )
    q, k_pages, v_pages, tables, lens = make_problem(
        batch, context, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim, block_size=args.block_size, dtype=dtype,
        pool_bytes=int(args.pool_gb * 2**30), sequential_blocks=args.sequential_blocks,
        head_major_pages=head_major,
    )  # fmt: skip
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * dtype.size
    read = (k_pages, v_pages)
    if bits < 16:
        kv = QuantizedKVPages.from_values(k_pages, v_pages, bits, bits, group)
        if head_major:
            kv = kv._replace(rows=head_major_view(kv.rows))
        read = (kv.k, kv.v)
    per_token = layer_bytes_per_token(args.num_kv_heads, args.head_dim, dtype, bits, bits, group)
    read_bytes = batch * context * per_token
    return Problem(q, k_pages, v_pages, tables, lens, args.head_dim**-0.5, kv_bytes, read,
                   read_bytes)  # fmt: skip


def _bytes_read(problem: Problem, name: str) -> int:
    """The K/V bytes column `name` reads: the quantized pages' for the paged columns and the
    reference, the 16-bit bytes for the rest."""
    paged = name.startswith("paged") and name not in (PLAIN_COLUMN, "paged_read")
    return problem.read_bytes if paged or name == "gather_sdpa" else problem.kv_bytes


def _attention_runs(problem: Problem, args) -> dict:
    """The paged columns and the gather reference, each a function of the queries (so
    `--chained` can feed each call's output to the next), minus `--skip`s."""
    p = problem

    def paged(pages, **options):
        return lambda queries: paged_attention_decode(
            queries, *pages, p.tables, p.lens, scale=p.scale, **options
        )

    def gather_sdpa(queries):
        positions = (p.lens - 1)[:, None]
        return paged_attention_reference(
            queries, *p.read, p.tables, p.lens, positions, scale=p.scale
        )

    kernels = {
        name: paged((p.k_pages, p.v_pages) if name == PLAIN_COLUMN else p.read, **options)
        for name, options in paged_runs(args).items()
    }
    skip = set(getattr(args, "skip", []))
    return {
        name: gather_sdpa if name == "gather_sdpa" else kernels[name]
        for name in method_names(args)
        if name not in PEERS and name not in skip
    }


def _timer(args):
    """`timed(fn, q)`: microseconds a call of `fn` on queries `q`, each call's output the next
    one's queries under `--chained` (evaluated `PIPELINE_CALLS` at a time under
    `--pipelined`), else independent calls."""
    chained = getattr(args, "chained", False)
    pipeline = PIPELINE_CALLS if getattr(args, "pipelined", False) else 0

    def timed(fn, q) -> float:
        if chained:
            return time_mlx_chained(fn, q, pipeline=pipeline) * 1e6
        return time_mlx(lambda: fn(q)) * 1e6

    return timed


def bench_shape(batch: int, context: int, args, torch_ok: bool) -> dict:
    """Time every method at one shape; the row of the results table."""
    problem = _problem(batch, context, args)
    timed = _timer(args)
    row = {"batch": batch, "context": context, "kv_bytes": problem.kv_bytes,
           "read_bytes": problem.read_bytes, "us": {}, "tb_s": {},
           "max_abs_diff_vs_paged": {}}  # fmt: skip
    runs, outputs = _attention_runs(problem, args), {}
    for name, fn in list(runs.items()):
        try:
            outputs[name] = fn(problem.q)
        except (UnsupportedSpecError, KernelRenderError) as exc:  # a kernel this shape refuses
            print(f"B={batch} T={context}: {name} skipped: {exc}", flush=True)
            row.setdefault("skipped", {})[name] = str(exc)
            del runs[name]
    for name, fn in runs.items():
        row["us"][name] = timed(fn, problem.q)
    skip = set(getattr(args, "skip", []))
    if "paged_read" not in skip and paged_read_fits(args.head_dim, _DTYPES[args.dtype]):
        # Not an attention: the same bytes read with no math, the ceiling of the access pattern.
        read = lambda: paged_read(problem.k_pages, problem.v_pages, problem.tables, problem.lens)  # noqa: E731
        row["us"]["paged_read"] = time_mlx(read) * 1e6
    time_peers(problem, context, args, torch_ok and "torch_sdpa" not in skip, timed, row, outputs)
    _compare(row, outputs)
    row["tb_s"] = {
        name: _bytes_read(problem, name) / (us * 1e-6) / 1e12 for name, us in row["us"].items()
    }
    mx.clear_cache()
    return row


def paged_read_fits(head_dim: int, dtype: mx.Dtype) -> bool:
    """`paged_read` runs on CUDA, for rows whose 16-byte chunks divide a warp."""
    return current_backend() == "cuda" and 32 % (head_dim * dtype.size // 16) == 0


def _compare(row: dict, outputs: dict) -> None:
    """Everything against the paged kernel's output (the reference's where no kernel ran,
    e.g. the CPU smoke test)."""
    row["diff_base"] = next((n for n in ("paged", "gather_sdpa", "mlx_sdpa") if n in outputs), None)
    if row["diff_base"] is None:
        return
    reference = outputs[row["diff_base"]].astype(mx.float32)
    for name, out in outputs.items():
        diff = mx.max(mx.abs(out.astype(mx.float32) - reference)).item()
        row["max_abs_diff_vs_paged"][name] = diff


def main(args) -> int:
    """Run the sweep `args` describes; writes kernels.json and kernels.png under `--out`."""
    if args.replot:
        result = json.loads(Path(args.replot).read_text())
        out = Path(args.replot).with_suffix(".png")
        if not plot(result, out):
            return 1
        print(f"wrote {out}")
        return 0
    refusal = _refusal(args)
    if refusal:
        print(f"mlx-paged bench kernels: {refusal}")
        return 2
    torch_ok = cuda_torch() is not None
    copy = copy_bandwidth()
    print("device copy bandwidth (TB/s): " + ", ".join(f"{k} {v:.2f}" for k, v in copy.items()))
    floor = launch_floor()
    print("per-call floor (us): " + ", ".join(f"{k} {v:.1f}" for k, v in floor.items()))
    latent = getattr(args, "latent_dims", None)
    token_bytes = _DTYPES[args.dtype].size * (
        sum(latent) if latent else 2 * args.num_kv_heads * args.head_dim
    )
    shapes = [
        (batch, context)
        for batch in args.batch
        for context in args.context
        if batch * context * token_bytes <= args.max_kv_gb * 2**30
    ]
    rows = []
    for batch, context in progress(shapes, "timing kernel shapes", unit="shape"):
        if latent:  # MLA: latent pages, `latent_kernels.py`
            rows.append(bench_latent_shape(batch, context, args, _timer(args)))
        else:
            rows.append(bench_shape(batch, context, args, torch_ok))
        print_row(rows[-1], copy["copy_tb_s"])
    out_dir = Path(args.out)
    result = _result(args, rows, copy, floor, torch_ok)
    write_result(result, out_dir / "kernels.json")
    if plot(result, out_dir / "kernels.png"):
        print(f"wrote {out_dir / 'kernels.png'}")
    return 0


def _refusal(args) -> str | None:
    """Why this sweep cannot run, or None."""
    unknown = unknown_skips(args)
    if unknown:
        return (f"--skip {', '.join(unknown)}: no such column; this sweep's columns are "
                f"{', '.join(method_names(args))}")  # fmt: skip
    if getattr(args, "latent_dims", None) and (getattr(args, "kv_bits", 16) < 16 or args.kernel):
        return "--latent-dims times the latent kernels on 16-bit pages (no --kernel, --kv-bits)"
    if getattr(args, "pipelined", False) and not args.chained:
        return "--pipelined overlaps building and running chained calls; add --chained"
    if current_backend() is None:
        return (f"needs MLX on a GPU (Metal or CUDA); this machine runs MLX on "
                f"{mx.default_device()}")  # fmt: skip
    return None


def _result(args, rows: list, copy: dict, floor: dict, torch_ok: bool) -> dict:
    device = mx.device_info().get("device_name", "")
    shape = f"{args.num_heads}q/{args.num_kv_heads}kv heads, hd{args.head_dim}"
    if getattr(args, "latent_dims", None):
        shape = "MLA, {}q heads over latent {} + RoPE {}".format(args.num_heads, *args.latent_dims)
    return {
        "title": (
            f"paged decode attention, {shape}, {args.dtype}{_bits_title(args)}, block "
            f"{args.block_size}, {device or current_backend()}"
        ),
        "backend": current_backend(),
        "device": device,
        "mlx": mx.__version__,
        "machine": platform.machine(),
        "statistic": "median",
        "torch": (__import__("torch").__version__ if torch_ok else None),
        "copy": copy,
        "launch_floor": floor,
        "config": {k: v for k, v in vars(args).items() if k != "run"},
        "rows": rows,
    }


def _bits_title(args) -> str:
    bits = getattr(args, "kv_bits", 16)
    return f" pages at {bits} bits (groups of {args.kv_group_size})" if bits < 16 else ""
