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
from pathlib import Path

import mlx.core as mx

from mlx_paged.codegen.build import KernelRenderError
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode
from mlx_paged.kernels.paged_attention_reference import paged_attention_reference

from .paged_read import paged_read
from .problems import contiguous_kv, make_problem
from .timing import (
    copy_bandwidth,
    cuda_torch,
    launch_floor,
    time_mlx,
    time_mlx_chained,
    time_torch,
    to_torch,
)

_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}


PEERS = ("paged_read", "mlx_sdpa", "torch_sdpa")
# `--pipelined`: chained calls evaluated this many at a time, each batch's evaluation started
# before the next is built (fewer than one decode step's attention calls in small models).
PIPELINE_CALLS = 8


def paged_runs(args) -> dict[str, dict]:
    """Every paged-kernel column of a sweep: its name and its `paged_attention_decode` options
    (the routed kernel as `paged`, each `--kernel` forced as `paged_<kernel>`)."""
    runs = {"paged": {}}
    for kernel in getattr(args, "kernel", []):
        runs[f"paged_{kernel}"] = dict(kernel=kernel)
    return runs


def method_names(args) -> list[str]:
    """Every column a sweep with these arguments times, before `--skip` (its valid names),
    in table order: the paged columns, the gather reference, the peers."""
    return list(paged_runs(args)) + ["gather_sdpa"] + list(PEERS)


def unknown_skips(args) -> list[str]:
    """The `--skip` names that match no column of this sweep."""
    known = set(method_names(args))
    return [name for name in getattr(args, "skip", []) if name not in known]


def bench_shape(batch: int, context: int, args, torch_ok: bool) -> dict:
    dtype = _DTYPES[args.dtype]
    q, k_pages, v_pages, tables, lens = make_problem(
        batch,
        context,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        head_dim=args.head_dim,
        block_size=args.block_size,
        dtype=dtype,
        pool_bytes=int(args.pool_gb * 2**30),
        sequential_blocks=args.sequential_blocks,
        head_major_pages=getattr(args, "head_major_pages", False),
    )
    scale = args.head_dim**-0.5
    kv_bytes = 2 * batch * context * args.num_kv_heads * args.head_dim * dtype.size
    positions = (lens - 1)[:, None]

    def paged(**options):
        return lambda queries: paged_attention_decode(
            queries, k_pages, v_pages, tables, lens, scale=scale, **options
        )

    def gather_sdpa(queries):
        return paged_attention_reference(
            queries, k_pages, v_pages, tables, lens, positions, scale=scale
        )

    # Every method maps queries to an output of the queries' shape, so `--chained` can feed
    # each call's output to the next. The peers are timed below.
    kernels = {name: paged(**options) for name, options in paged_runs(args).items()}
    runs = {
        name: gather_sdpa if name == "gather_sdpa" else kernels[name]
        for name in method_names(args)
        if name not in PEERS
    }
    skip = set(getattr(args, "skip", []))
    for name in skip & set(runs):
        del runs[name]
    chained = getattr(args, "chained", False)
    pipeline = PIPELINE_CALLS if getattr(args, "pipelined", False) else 0

    def timed(fn) -> float:
        if chained:
            return time_mlx_chained(fn, q, pipeline=pipeline) * 1e6
        return time_mlx(lambda: fn(q)) * 1e6

    row = {
        "batch": batch,
        "context": context,
        "kv_bytes": kv_bytes,
        "us": {},
        "tb_s": {},
        "max_abs_diff_vs_paged": {},
    }
    outputs: dict = {}
    for name, fn in list(runs.items()):
        try:
            outputs[name] = fn(q)
        except (UnsupportedSpecError, KernelRenderError) as exc:  # a kernel this shape refuses
            print(f"B={batch} T={context}: {name} skipped: {exc}", flush=True)
            row.setdefault("skipped", {})[name] = str(exc)
            del runs[name]
    for name, fn in runs.items():
        row["us"][name] = timed(fn)
    if (
        "paged_read" not in skip
        and current_backend() == "cuda"
        and 32 % (args.head_dim * dtype.size // 16) == 0
    ):
        # Not an attention: the same bytes read with no math, the ceiling of the access pattern.
        row["us"]["paged_read"] = time_mlx(lambda: paged_read(k_pages, v_pages, tables, lens)) * 1e6
    torch_ok = torch_ok and "torch_sdpa" not in skip
    if "mlx_sdpa" in skip and not torch_ok:
        k = v = None  # no contiguous peer asked for: skip the copy
    else:
        k, v = contiguous_kv(k_pages, v_pages, tables, context)
    if "mlx_sdpa" not in skip:

        def sdpa(queries):
            return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale)

        outputs["mlx_sdpa"] = sdpa(q)
        row["us"]["mlx_sdpa"] = timed(sdpa)
    if torch_ok:
        import torch
        import torch.nn.functional as F

        tq, tk, tv = to_torch(q), to_torch(k), to_torch(v)
        del k, v
        gqa = args.num_heads != args.num_kv_heads
        tout = F.scaled_dot_product_attention(tq, tk, tv, scale=scale, enable_gqa=gqa)
        torch.cuda.synchronize()
        outputs["torch_sdpa"] = mx.array(tout.float().cpu().numpy())
        row["us"]["torch_sdpa"] = (
            time_torch(
                lambda: F.scaled_dot_product_attention(tq, tk, tv, scale=scale, enable_gqa=gqa)
            )
            * 1e6
        )
        del tq, tk, tv, tout
    else:
        del k, v
    # Everything is compared with the paged kernel's output (with the reference's where no
    # kernel ran, e.g. the CPU smoke test).
    row["diff_base"] = next((n for n in ("paged", "gather_sdpa", "mlx_sdpa") if n in outputs), None)
    if row["diff_base"] is not None:
        reference = outputs[row["diff_base"]].astype(mx.float32)
        for name, out in outputs.items():
            row["max_abs_diff_vs_paged"][name] = mx.max(
                mx.abs(out.astype(mx.float32) - reference)
            ).item()
    row["tb_s"] = {name: kv_bytes / (us * 1e-6) / 1e12 for name, us in row["us"].items()}
    mx.clear_cache()
    return row


def print_row(row: dict, copy_tb_s: float) -> None:
    cells = "  ".join(
        f"{name} {row['us'][name]:9.1f}us {row['tb_s'][name]:5.2f}TB/s" for name in row["us"]
    )
    share = (
        f"  paged/copy {row['tb_s']['paged'] / copy_tb_s:4.0%}" if "paged" in row["tb_s"] else ""
    )
    print(
        f"B={row['batch']:4d} T={row['context']:6d} KV={row['kv_bytes'] / 2**20:8.1f}MiB  "
        f"{cells}{share}",
        flush=True,
    )


def plot(result: dict, path: Path) -> bool:
    """Achieved TB/s vs context, one line per method, one panel per batch size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return False
    batches = sorted({r["batch"] for r in result["rows"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), squeeze=False)
    for ax, batch in zip(axes[0], batches):
        rows = [r for r in result["rows"] if r["batch"] == batch]
        names = list(dict.fromkeys(name for r in rows for name in r["tb_s"]))
        for name in names:
            pts = [(r["context"], r["tb_s"][name]) for r in rows if name in r["tb_s"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.axhline(result["copy"]["copy_tb_s"], color="gray", linestyle="--", label="copy")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {batch}")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("TB/s (K+V bytes / time)")
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(result["title"], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main(args) -> int:
    if args.replot:
        result = json.loads(Path(args.replot).read_text())
        out = Path(args.replot).with_suffix(".png")
        if not plot(result, out):
            return 1
        print(f"wrote {out}")
        return 0
    unknown = unknown_skips(args)
    if unknown:
        print(
            f"mlx-paged bench kernels: --skip {', '.join(unknown)}: no such column; this "
            f"sweep's columns are {', '.join(method_names(args))}"
        )
        return 2
    if getattr(args, "pipelined", False) and not args.chained:
        print(
            "mlx-paged bench kernels: --pipelined overlaps building and running chained "
            "calls; add --chained"
        )
        return 2
    backend = current_backend()
    if backend is None:
        print(
            "mlx-paged bench kernels needs MLX on a GPU (Metal or CUDA); this machine runs "
            f"MLX on {mx.default_device()}"
        )
        return 2
    torch_ok = cuda_torch() is not None
    copy = copy_bandwidth()
    print("device copy bandwidth (TB/s): " + ", ".join(f"{k} {v:.2f}" for k, v in copy.items()))
    floor = launch_floor()
    print("per-call floor (us): " + ", ".join(f"{k} {v:.1f}" for k, v in floor.items()))
    dtype_size = _DTYPES[args.dtype].size
    rows = []
    for batch in args.batch:
        for context in args.context:
            kv = 2 * batch * context * args.num_kv_heads * args.head_dim * dtype_size
            if kv > args.max_kv_gb * 2**30:
                continue
            row = bench_shape(batch, context, args, torch_ok)
            rows.append(row)
            print_row(row, copy["copy_tb_s"])
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {
        "title": (
            f"paged decode attention, {args.num_heads}q/{args.num_kv_heads}kv heads, "
            f"hd{args.head_dim}, {args.dtype}, block {args.block_size}, "
            f"{mx.device_info().get('device_name', backend)}"
        ),
        "backend": backend,
        "device": mx.device_info().get("device_name", ""),
        "mlx": mx.__version__,
        "machine": platform.machine(),
        "statistic": "median",
        "torch": (__import__("torch").__version__ if torch_ok else None),
        "copy": copy,
        "launch_floor": floor,
        "config": {k: v for k, v in vars(args).items() if k != "run"},
        "rows": rows,
    }
    (out_dir / "kernels.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out_dir / 'kernels.json'}")
    if plot(result, out_dir / "kernels.png"):
        print(f"wrote {out_dir / 'kernels.png'}")
    return 0
