"""The kernel benchmark's output: one line per shape, and TB/s against context per batch."""

from __future__ import annotations

from pathlib import Path

from .output import load_pyplot


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
    plt = load_pyplot()
    if plt is None:
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
