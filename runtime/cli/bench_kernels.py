"""The flags of `mlx-paged bench kernels`: the decode-attention shapes it sweeps and how it
times them."""

from __future__ import annotations

import argparse

from mlx_paged.kernels.kernel_spec import KERNELS
from mlx_paged.kernels.quantized_pages import KV_BITS, KV_GROUP_SIZES


def add_kernels_bench(sub: argparse._SubParsersAction, run) -> None:
    """Add `bench kernels` (run by `run`): the shapes it sweeps, where it writes, and what it
    times."""
    p = sub.add_parser(
        "kernels",
        help="paged decode kernel vs MLX SDPA, gather+SDPA, torch SDPA and copy bandwidth (GPU)",
    )
    p.add_argument(
        "--batch", type=int, nargs="+", default=[1, 8, 32, 64, 128], help="sequences per call"
    )
    p.add_argument(
        "--context",
        type=int,
        nargs="+",
        default=[512, 2048, 8192, 32768],
        help="tokens of K/V each sequence attends to",
    )
    p.add_argument("--num-heads", type=int, default=32, help="query heads")
    p.add_argument(
        "--latent-dims",
        type=int,
        nargs=2,
        metavar=("LATENT", "ROPE"),
        default=None,
        help="time MLA decode over latent pages of these sizes a token (e.g. 512 64, "
        "DeepSeek-V3's; with --num-heads 128) instead of per-head K/V",
    )
    p.add_argument("--num-kv-heads", type=int, default=8, help="K/V heads")
    p.add_argument("--head-dim", type=int, default=128, help="dimension of a head")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    p.add_argument(
        "--dtype",
        choices=["bfloat16", "float16", "float32"],
        default="bfloat16",
        help="dtype of queries and 16-bit pages",
    )
    _add_kernels_pages(p)
    p.add_argument("--out", default="bench/out/kernels", help="folder for kernels.json/.png")
    _add_kernels_methods(p)
    p.set_defaults(run=run)


def _add_kernels_pages(p: argparse.ArgumentParser) -> None:
    """The pages `bench kernels` reads: their bits, scale groups and pool size."""
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=list(KV_BITS),
        default=16,
        help="bits per K/V value of the pages; below 16 the paged columns read quantized "
        "pages and paged_16bit times the same values at 16 bits (default 16)",
    )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=list(KV_GROUP_SIZES),
        default=32,
        help="values per scale and bias of quantized pages",
    )
    p.add_argument(
        "--pool-gb",
        type=float,
        default=1.0,
        help="smallest page pool, in GiB (keep it well above the GPU's cache)",
    )
    p.add_argument(
        "--max-kv-gb", type=float, default=8.0, help="skip shapes whose K+V exceed this many GiB"
    )


def _add_kernels_methods(p: argparse.ArgumentParser) -> None:
    """What `bench kernels` times, and how."""
    p.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="NAME",
        choices=[k for k in KERNELS if k != "decode_reduce"],
        help="also time this kernel forced, as column paged_<NAME> (repeatable; "
        "see docs/kernels.md)",
    )
    p.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="METHOD",
        help="leave this column out (repeatable), to spend less GPU time on a "
        "sweep: gather_sdpa, paged_read, mlx_sdpa, torch_sdpa, or a "
        "paged_<NAME> that --kernel adds",
    )
    p.add_argument(
        "--sequential-blocks",
        action="store_true",
        help="give each sequence consecutive blocks instead of shuffled ones",
    )
    p.add_argument(
        "--head-major-pages",
        action="store_true",
        help="with --kv-bits 8 or 4, store each page's quantized rows KV-head-major (one "
        "head's rows of a page contiguous) and pass the kernels their token-major view: a "
        "layout experiment",
    )
    p.add_argument(
        "--chained",
        action="store_true",
        help="feed each timed call's output to the next as its queries, so MLX "
        "runs the calls one after another (by default independent calls may "
        "overlap in MLX's CUDA graphs); paged_read stays unchained",
    )
    p.add_argument(
        "--pipelined",
        action="store_true",
        help="with --chained: start evaluating every 8 calls while the next are "
        "built (mx.async_eval), as the engine's decode overlaps host and GPU; "
        "without it all calls are built before any runs",
    )
    p.add_argument(
        "--replot",
        default=None,
        metavar="JSON",
        help="only redraw the plot of an earlier run's kernels.json",
    )
