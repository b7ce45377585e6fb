"""The README's headline table: one row per public benchmark, each figure linking to its
section of docs/benchmarks.md (generated with it by `make bench-docs`)."""

from __future__ import annotations

from .report_decode import default_method
from .serve_report import rows as serve_rows

DOC = "docs/benchmarks.md"


def _link(text: str, anchor: str) -> str:
    return f"[{text}]({DOC}#{anchor})"


def _gpu_name(run: dict) -> str:
    """The GPU's short name: H200 for "NVIDIA H200", H100 for "NVIDIA H100 80GB HBM3"."""
    return run["device"].removeprefix("NVIDIA ").split()[0]


def _kernel_row(chained: dict) -> list[str]:
    big = [r for r in chained["rows"] if r["kv_bytes"] >= 2**30]
    of_copy = [r["tb_s"]["paged"] / chained["copy"]["copy_tb_s"] for r in big]
    vs_mlx = [r["us"]["mlx_sdpa"] / r["us"]["paged"] for r in big]
    return [
        "decode attention, 1-8 GiB of KV, chained calls (H200)",
        _link(
            f"{min(of_copy):.0%}-{max(of_copy):.0%} of copy bandwidth", "decode-attention-kernels"
        ),
        "MLX SDPA on contiguous K/V",
        f"{min(vs_mlx):.2f}-{max(vs_mlx):.2f}x",
    ]


def headline(
    chained: dict, decode: dict, memory: dict, prefix: dict, throughput: dict, serve: dict
) -> str:
    """The Markdown table (no trailing newline)."""
    paged, bg = default_method(decode), decode["methods"]["batch_generator"]
    dense = memory["results"]["paged"]["sequences_at_budget"]
    padded = memory["results"]["mlx_lm_batch_generator"]["sequences_at_budget"]
    ratios = [r["paged_vs_batch_generator"] for r in throughput["rows"]]
    served = serve_rows(serve)[-1]
    rows = [
        [
            f"served over HTTP, 1B llama, {served['level']} ({_gpu_name(serve)})",
            _link(f"{served['ours_tok_s']:,.0f} out tok/s", "serving-over-http"),
            f"`mlx_lm.server` {served['peer_tok_s']:,.0f} out tok/s",
            f"{served['ratio']:.2f}x",
        ],
        [
            f"decode, 1B llama, batch {decode['batch']} x {decode['prompt_tokens']}"
            f" ({_gpu_name(decode)})",
            _link(f"{paged['decode_tok_s']:,.0f} tok/s", "end-to-end-decode-throughput"),
            f"mlx-lm `BatchGenerator` {bg['decode_tok_s']:,.0f} tok/s",
            f"{paged['vs_batch_generator']:.2f}x",
        ],
        _kernel_row(chained),
        [
            "sequences in the same KV memory",
            _link(f"{dense:.1f}", "kv-memory-density"),
            f"left-padded caches {padded:.1f}",
            f"{dense / padded:.1f}x",
        ],
        [
            "time to first token behind a cached system prompt (CPU)",
            _link(f"{prefix['warm_ttft_s']:.2f} s", "prefix-caching"),
            f"cold {prefix['cold_ttft_s']:.1f} s",
            f"{prefix['speedup']:.1f}x",
        ],
        [
            "engine tokens/s, SmolLM2 (CPU)",
            _link(
                f"{min(ratios):.2f}-{max(ratios):.2f}x of `BatchGenerator`",
                "engine-throughput-against-mlx-lms-batchgenerator",
            ),
            "mlx-lm `BatchGenerator`",
            f"{min(ratios):.2f}-{max(ratios):.2f}x",
        ],
    ]
    lines = ["| | mlx-paged | peer | ratio |", "| --- | --- | --- | --- |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def figures(
    chained: dict, decode: dict, memory: dict, prefix: dict, throughput: dict, serve: dict
) -> dict[str, str]:
    """Figures the README's prose quotes, by name (`<!-- fig:NAME -->`), from the same runs as
    the table."""
    dense = memory["results"]["paged"]["sequences_at_budget"]
    padded = memory["results"]["mlx_lm_batch_generator"]["sequences_at_budget"]
    ratios = [r["ratio"] for r in serve_rows(serve)]
    return {
        "density": f"{dense / padded:.1f}x",
        "serve_ratio": f"{min(ratios):.1f}-{max(ratios):.1f}x",
        "decode_ratio": f"{default_method(decode)['vs_batch_generator']:.1f}x",
    }
