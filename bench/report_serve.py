"""The serving and prefill sections of docs/benchmarks.md, from `bench serve` and
`bench prefill` runs."""

from __future__ import annotations

from .report_table import table as _table
from .serve_report import rows as serve_rows

SERVE_RUN = "h100-serve-llama1b.json"
SERVE_PLOT = "h100-serve-llama1b.png"
CPU_SERVE_RUN = "cpu-serve-smollm2.json"
CPU_SERVE_COMMAND = (
    "mlx-paged bench serve --concurrency 1 8 --prompt-tokens 128 --max-tokens 32 --min-requests 8"
)
PREFILL_RUN = "h200-prefill-llama1b.json"


def _tok_s(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def _ms(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


CUDA_SHAPES_NOTE = """
On CUDA, MLX's SDPA builds a cuDNN graph the first time it meets an attention shape (about
60 ms on the H200, then 0.1-0.4 ms a call). The engine runs prefill attention in power-of-two
buckets and builds every bucket before it serves
([architecture](architecture.md#the-step-engineschedulerpy)), so no level pays that build.
"""


def serve(run: dict) -> str:
    return _serve_section(run, "Serving over HTTP", SERVE_RUN, SERVE_PLOT,
                          "mlx-paged bench serve --random-llama --concurrency 1 16 64"
                          ) + CUDA_SHAPES_NOTE  # fmt: skip


def cpu_serve(run: dict) -> str:
    return _serve_section(run, "Serving over HTTP on the CPU", CPU_SERVE_RUN,
                          CPU_SERVE_RUN.replace(".json", ".png"), CPU_SERVE_COMMAND)  # fmt: skip


def _serve_section(run: dict, title: str, name: str, plot: str, command: str) -> str:
    w = run["workload"]
    peer = next(n for n in run["servers"] if n != "mlx-paged")
    rows = [[r["level"], _tok_s(r["ours_tok_s"]), _tok_s(r["peer_tok_s"]),
             f"{r['ratio']:.2f}x", f"{r['of_offline']:.0%}",
             f"{_ms(r['ttft_p50'])} / {_ms(r['peer_ttft_p50'])}",
             f"{_ms(r['itl_p50'])} / {_ms(r['itl_p99'])}", f"{r['errors']} / {r['peer_errors']}"]
            for r in serve_rows(run)]  # fmt: skip
    header = ["level", "mlx-paged out tok/s", peer, "ratio", "of our offline",
              f"TTFT p50 ours / {peer} ms", "ITL p50 / p99 ours ms",
              f"errors ours / {peer}"]  # fmt: skip
    return f"""## {title}

What: our server and `{peer}` on the same model ({run["model"]}), one after the
other in one run, each warmed up before every level; streamed `/v1/completions` of about
{w["prompt_tokens"]}-token prompts (random text, distinct per request), up to
{w["max_tokens"]} tokens each, greedy; each level sends max({w["min_requests"]}, 2 x concurrency)
requests with that many in flight. TTFT and ITL are timed by the client from the SSE events;
output tokens are the usage each server reports. "Of our offline" is our served tok/s over
`LLM.generate` on the same prompts at the same concurrency. Errors are streams that broke off
(connection resets).

```bash
{command}
```

Results: `bench/results/{name}` and `bench/results/{plot}`
({run["device"]}, MLX {run["mlx"]}).

{_table(header, rows)}
"""


def prefill(run: dict) -> str:
    m = run["methods"]
    sizes = sorted({int(k.rsplit("_", 1)[1]) for k in m})
    rows = []
    for n in sizes:
        ours = m[f"paged_prefill_batch_{n}"]["prefill_tok_s"]
        theirs = m[f"batch_generator_prefill_batch_{n}"]["prefill_tok_s"]
        rows.append([str(n), f"{ours:,.0f}", f"{theirs:,.0f}", f"{ours / theirs:.2f}x"])
    return f"""## Prefill throughput

What: {run["batch"]} uncached prompts of {run["prompt_tokens"]} random tokens to their first
token, on a {run["model"]}: the paged engine (prefix caching off) against mlx-lm's
`BatchGenerator`, with the same number of prompts prefilling at once; prefill tokens/s =
prompts x prompt tokens / time, median of {run["repeats"]} after a warm-up. The engine paces
its prompt chunks to steps of at most 0.5 s (`--prefill-chunk-seconds`), which these sizes do
not reach on a GPU; its pacer starts each engine at small chunks and learns the step cost in a
few steps, so the first runs of a fresh engine are slower (the runs are in the JSON).

```bash
mlx-paged bench prefill --batch 64 --prompt 512 --prefill-batch 8 64
```

Results: `bench/results/{PREFILL_RUN}` ({run["device"]}).

{_table(["prompts at once", "paged tok/s", "BatchGenerator tok/s", "paged / BG"], rows)}
"""
