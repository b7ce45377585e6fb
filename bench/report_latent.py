"""The MLA decode-kernel section of docs/benchmarks.md, from `bench kernels --latent-dims`
runs (one a head count)."""

from __future__ import annotations

from .report_table import table

LATENT_RUNS = ("h100-kernels-mla16.json", "h100-kernels-mla128.json")
LATENT_COMMAND = (
    "mlx-paged bench kernels --latent-dims 512 64 --num-heads {heads} --batch 8 32 "
    "--context 8192 32768 --chained"
)


def _rows(run: dict) -> list[list[str]]:
    copy = run["copy"]["copy_tb_s"]
    rows = []
    for row in run["rows"]:
        us, tb_s = row["us"], row["tb_s"]
        rows.append(
            [str(run["config"]["num_heads"]), str(row["batch"]), str(row["context"]),
             f"{row['read_bytes'] / 2**20:.0f} MiB", f"{us['paged']:.1f}",
             f"{tb_s['paged']:.2f}", f"{tb_s['paged'] / copy:.0%}",
             f"{us['gather_sdpa']:.0f} ({us['gather_sdpa'] / us['paged']:.0f}x)"]
        )  # fmt: skip
    return rows


def latent_kernels(*runs: dict) -> str:
    header = ["heads", "batch", "context", "latent rows", "kernel µs", "TB/s", "of copy",
              "gather reference µs"]  # fmt: skip
    rows = [row for run in runs for row in _rows(run)]
    commands = "\n".join(LATENT_COMMAND.format(heads=run["config"]["num_heads"]) for run in runs)
    files = ", ".join(f"`bench/results/{name}`" for name in LATENT_RUNS)
    worst = max(d for run in runs for row in run["rows"]
                for d in row["max_abs_diff_vs_paged"].values())  # fmt: skip
    first = runs[0]
    return f"""## MLA decode kernel

What: one decode-attention call of multi-head latent attention (DeepSeek's rows: latent 512 +
RoPE 64 values a token, bf16, blocks of 16 drawn shuffled from a pool of at least 1 GiB) in
the absorbed form, chained (each call's output is the next call's latent queries): both
passes of the routed kernel (docs/kernels.md) beside the pure-MLX gather reference. TB/s
counts the latent and RoPE rows, read once for all heads; "of copy" compares it with the copy
bandwidth measured in the same run. 16 heads is DeepSeek-V2-Lite's count, 128 DeepSeek-V3's.

```bash
{commands}
```

Results: {files}.

{table(header, rows)}

{first["device"]}, MLX {first["mlx"]}. Copy bandwidth in the same runs:
{", ".join(f"{run['copy']['copy_tb_s']:.2f}" for run in runs)} TB/s. Largest difference of
any other column's output (the reference's, each pass-1 kernel's forced) from the routed
kernel's: {worst:.4f}.
"""
