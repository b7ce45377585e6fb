"""The table and the plot of a `bench serve` result."""

from __future__ import annotations

from pathlib import Path

from .output import load_pyplot

OURS = "mlx-paged"


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def rows(result: dict) -> list[dict]:
    """One row per level: our figures, the peer's, their ratio and ours against offline."""
    servers = result["servers"]
    ours = servers.get(OURS, {})
    peer_name = next((n for n in servers if n != OURS), None)
    peer = servers.get(peer_name, {}) if peer_name else {}
    out = []
    for level, mine in ours.items():
        theirs = peer.get(level)
        offline = result.get("offline", {}).get(level)
        out.append({
            "level": level,
            "ours_tok_s": mine["output_tok_s"],
            "peer_tok_s": theirs["output_tok_s"] if theirs else None,
            "ratio": mine["output_tok_s"] / theirs["output_tok_s"]
            if theirs and theirs["output_tok_s"] else None,
            "of_offline": mine["output_tok_s"] / offline["output_tok_s"] if offline else None,
            "ttft_p50": mine["ttft_ms"]["p50"],
            "peer_ttft_p50": theirs["ttft_ms"]["p50"] if theirs else None,
            "itl_p50": mine["itl_ms"]["p50"],
            "itl_p99": mine["itl_ms"]["p99"],
            "errors": mine["errors"],
            "peer_errors": theirs["errors"] if theirs else None,
        })  # fmt: skip
    return out


def print_table(result: dict) -> None:
    """A Markdown table of `rows(result)`."""
    if not rows(result):
        return
    peer = next((n for n in result["servers"] if n != OURS), "peer")
    print(f"\n| level | {OURS} out tok/s | {peer} | ratio | of offline | TTFT p50 ours / "
          f"{peer} ms | ITL p50 / p99 ours ms | errors ours / {peer} |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows(result):
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        offline = "-" if r["of_offline"] is None else f"{r['of_offline']:.0%}"
        print(f"| {r['level']} | {_fmt(r['ours_tok_s'])} | {_fmt(r['peer_tok_s'])} | {ratio} | "
              f"{offline} | {_fmt(r['ttft_p50'])} / {_fmt(r['peer_ttft_p50'])} | "
              f"{_fmt(r['itl_p50'])} / {_fmt(r['itl_p99'])} | {r['errors']} / "
              f"{_fmt(r['peer_errors'], 0)} |")  # fmt: skip


def plot(result: dict, path: Path) -> bool:
    """Output tok/s and TTFT p50 per level, ours against the peer; False without matplotlib."""
    plt = load_pyplot()
    if plt is None:
        return False
    if not any(result["servers"].values()):
        return False  # a long-prompt run only: nothing per level to draw
    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(11, 4))
    for name, levels in result["servers"].items():
        labels = list(levels)
        tput.plot(labels, [levels[k]["output_tok_s"] for k in labels], marker="o", label=name)
        ttft.plot(labels, [levels[k]["ttft_ms"]["p50"] or 0 for k in labels], marker="o",
                  label=name)  # fmt: skip
    if result.get("offline"):
        labels = list(result["offline"])
        tput.plot(labels, [result["offline"][k]["output_tok_s"] for k in labels], "k--",
                  label=f"{OURS} offline")  # fmt: skip
    tput.set(title="output tokens/s", ylabel="tok/s")
    ttft.set(title="time to first token, p50", ylabel="ms", yscale="log")
    for ax in (tput, ttft):
        ax.legend()
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"wrote {path}")
    return True
