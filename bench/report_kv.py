"""The quantized-KV quality section of docs/benchmarks.md, from a `bench kv-quality` run."""

from __future__ import annotations

from .report_table import table

KV_QUALITY_COMMAND = "mlx-paged bench kv-quality"


def kv_quality(run: dict) -> str:
    rows = [
        [name, f"{r['perplexity']:.4f}", f"{r['perplexity_change']:+.2%}", f"{r['mean_kl']:.5f}",
         f"{r['top1_agreement']:.1%}",
         f"{r['greedy']['first_difference']} / {run['new_tokens']}",
         f"{r['greedy']['agreement']:.0%}"]
        for name, r in run["settings"].items()
    ]  # fmt: skip
    header = ["pages", "perplexity", "vs 16-bit", "mean KL vs 16-bit", "top-1 agreement",
              "greedy tokens before the first difference", "greedy tokens equal"]  # fmt: skip
    return f"""## Quantized KV quality

What: {run["model"]} reads {run["tokens"]:,} tokens of held-out text through the paged path
in chunks of {run["chunk"]}, once per page setting (groups of {run["group_size"]}); the text:
{run["text"]}. Every chunk after the first attends over the pages the earlier chunks wrote,
quantized on write, as chunked prefill and decode do. Perplexity of the text; KL divergence of
each next-token distribution from 16-bit's and how often the top token agrees; then
{run["new_tokens"]} greedy tokens through the engine from the text's first
{run["prompt_tokens"]} tokens, compared with 16-bit's.

```bash
{KV_QUALITY_COMMAND}
```

Results: `bench/results/cpu-kv-quality-smollm2.json` ({run["device"]}, MLX {run["mlx"]}).

{table(header, rows)}
"""
