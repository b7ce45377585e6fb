"""The sections of docs/benchmarks.md: for each public benchmark, what it measures, the command
that made its committed run, and its table, rendered from that run's JSON."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .report_agents import SPECULATIVE_RUN, STRUCTURED_RUN, speculative, structured
from .report_decode import DECODE_RUNS, HYBRID_DECODE_RUN, decode, hybrid_decode
from .report_kv import kv_quality
from .report_latent import LATENT_RUNS, latent_kernels
from .report_memory import (
    gemma4_window_memory,
    hybrid_memory,
    latent_memory,
    memory,
    window_memory,
)
from .report_ops import ops
from .report_serve import CPU_SERVE_RUN, PREFILL_RUN, SERVE_RUN, cpu_serve, prefill, serve
from .report_table import table as _table

KERNEL_COMMAND = (
    "mlx-paged bench kernels --batch 1 8 32 64 128 --context 2048 8192 32768 --skip gather_sdpa"
)


@dataclass(frozen=True)
class Section:
    files: tuple[str, ...]
    render: Callable[..., str]


def _mib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.0f} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f} MiB"


def _kernel_rows(run: dict) -> list[list[str]]:
    copy = run["copy"]["copy_tb_s"]
    rows = []
    for row in run["rows"]:
        us = row["us"]
        paged = us["paged"]
        rows.append(
            [
                str(row["batch"]),
                str(row["context"]),
                _mib(row["kv_bytes"]),
                f"{paged:.1f}",
                f"{row['tb_s']['paged']:.2f}",
                f"{row['tb_s']['paged'] / copy:.0%}",
                *(
                    f"{us[peer]:.1f} ({us[peer] / paged:.2f}x)" if peer in us else "-"
                    for peer in ("paged_read", "mlx_sdpa", "torch_sdpa")
                ),
            ]
        )
    return rows


def _kernel_table(run: dict) -> str:
    header = [
        "batch",
        "context",
        "K+V",
        "paged µs",
        "TB/s",
        "of copy",
        "paged read µs",
        "MLX SDPA µs",
        "torch SDPA µs",
    ]
    worst = max(
        d
        for row in run["rows"]
        for name, d in row["max_abs_diff_vs_paged"].items()
        if name != "paged"
    )
    return (
        _table(header, _kernel_rows(run)) + "\n\n"
        f"{run['device']}, MLX {run['mlx']}, PyTorch {run['torch']}. Copy bandwidth in the "
        f"same run: {run['copy']['copy_tb_s']:.2f} TB/s (torch `copy_`; MLX "
        f"{run['copy']['mlx_copy_tb_s']:.2f}); per-call floor "
        f"{run['launch_floor']['custom_kernel_us']:.1f} µs for a one-thread custom kernel, "
        f"{run['launch_floor']['sdpa_16_tokens_us']:.1f} µs for MLX's SDPA on 16 tokens. "
        f"Peers' times in parentheses are multiples of the paged kernel's. Largest "
        f"difference of any peer's output from the kernel's: {worst:.4f}.\n"
    )


def kernels(queued: dict, chained: dict, pipelined: dict) -> str:
    return f"""## Decode attention kernels

What: one decode-attention call over a paged KV cache (32 query / 8 KV heads, head_dim 128,
bf16, blocks of 16, pages drawn shuffled from a pool of at least 1 GiB), the kernel as routed
(docs/kernels.md) beside `paged_read` (a no-math kernel reading exactly the kernel's bytes
through the same block tables: the ceiling of the access pattern), MLX's
`scaled_dot_product_attention` on contiguous K/V (cuDNN's flash kernel on CUDA) and PyTorch's
SDPA. TB/s is K+V bytes over the median time; "of copy" compares it with the device copy
bandwidth measured in the same run. Each sample queues enough calls to last 50 ms.

### Chained: each call's output is the next call's queries, as in a model

```bash
{KERNEL_COMMAND} --chained
```

Results: `bench/results/h200-kernels-chained.json` (plot: `h200-kernels-chained.png`).

{_kernel_table(chained)}
### Pipelined: chained, evaluated 8 calls at a time while the next are built

This is how the engine decodes (it builds step t + 1 while step t runs) and how torch launches.

```bash
{KERNEL_COMMAND} --chained --pipelined
```

Results: `bench/results/h200-kernels-pipelined.json` (plot: `h200-kernels-pipelined.png`).

{_kernel_table(pipelined)}
### Queued: independent calls, which MLX's CUDA graphs may overlap

```bash
{KERNEL_COMMAND}
```

Results: `bench/results/h200-kernels.json` (plot: `h200-kernels.png`).

{_kernel_table(queued)}"""


def prefix_cache(run: dict) -> str:
    rows = [
        ["cold", f"{run['cold_ttft_s']:.2f} s", str(run["prompt_tokens"])],
        [
            "warm",
            f"{run['warm_ttft_s']:.2f} s",
            f"{run['prompt_tokens'] - run['cached_tokens_warm']} "
            f"({run['cached_tokens_warm']} from the cache)",
        ],
    ]
    return f"""## Prefix caching

What: time to first token of a {run["prompt_tokens"]}-token chat prompt whose system part
repeats, on {run["model"]}: cold (prefix cache emptied first) against warm (the same system
prompt served just before; the user turn differs). Median of {run["repeats"]} each.

```bash
mlx-paged bench prefix-cache
```

Results: `bench/results/cpu-prefix-cache-smollm2.json` (CPU).

{_table(["", "time to first token", "prompt tokens computed"], rows)}

{run["speedup"]:.1f}x faster to the first token.
"""


def throughput(run: dict) -> str:
    rows = [
        [
            str(r["concurrency"]),
            f"{r['paged_tok_s']:.1f}",
            f"{r['contiguous_tok_s']:.1f}",
            f"{r['batch_generator_tok_s']:.1f}",
            f"{r['paged_vs_batch_generator']:.2f}",
            f"{r['contiguous_vs_batch_generator']:.2f}",
        ]
        for r in run["rows"]
    ]
    return f"""## Engine throughput against mlx-lm's BatchGenerator

What: tokens/s of the whole engine (prefill included) on {run["model"]}: `c` chat prompts
submitted at once, {run["rows"][0]["max_tokens"]} new tokens each, EOS ignored; the paged path
without prefix caching (the runs repeat the same prompts). One warm-up, then
{run["repeats"]} alternating runs of each, median.

```bash
mlx-paged bench throughput
```

Results: `bench/results/cpu-throughput-smollm2.json` ({run["device"]}, MLX {run["mlx"]}).

{
        _table(
            [
                "concurrency",
                "paged tok/s",
                "contiguous tok/s",
                "BatchGenerator tok/s",
                "paged / BG",
                "contiguous / BG",
            ],
            rows,
        )
    }
"""


SECTIONS = (
    Section(
        ("h200-kernels.json", "h200-kernels-chained.json", "h200-kernels-pipelined.json"), kernels
    ),
    Section(LATENT_RUNS, latent_kernels),
    Section(DECODE_RUNS, decode),
    Section((HYBRID_DECODE_RUN,), hybrid_decode),
    Section((PREFILL_RUN,), prefill),
    Section((SERVE_RUN,), serve),
    Section((CPU_SERVE_RUN,), cpu_serve),
    Section((STRUCTURED_RUN,), structured),
    Section((SPECULATIVE_RUN,), speculative),
    Section(("cpu-memory-density.json",), memory),
    Section(("cpu-memory-density-qwen3_5.json",), hybrid_memory),
    Section(("cpu-memory-density-gemma3.json",), window_memory),
    Section(("cpu-memory-density-gemma4.json",), gemma4_window_memory),
    Section(("cpu-memory-density-deepseek_v3.json",), latent_memory),
    Section(("cpu-kv-quality-smollm2.json",), kv_quality),
    Section(("cpu-prefix-cache-smollm2.json",), prefix_cache),
    Section(("cpu-throughput-smollm2.json",), throughput),
    Section(("cpu-ops.json",), ops),
)
