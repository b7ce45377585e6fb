"""The op-count section of docs/benchmarks.md (`bench ops`)."""

from __future__ import annotations

from .report_table import table


def ops(run: dict) -> str:
    few, many = run["layers_compared"]
    rows = [
        [family, f"{r['ops_per_layer']:g}", str(r["ops_per_step"]),
         f"{r['fused_ops_per_layer']:g}" if "fused_ops_per_layer" in r else "-",
         str(r.get("fused_ops_per_step", "-")),
         f"{r['mlx_lm_ops_per_layer']:g}", str(r["mlx_lm_ops_per_step"])]
        for family, r in run["results"].items()
    ]  # fmt: skip
    header = ["model", "paged ops a layer", "paged ops a step", "fused ops a layer",
              "fused ops a step", "mlx-lm ops a layer", "mlx-lm ops a step"]  # fmt: skip
    summary = table(header, rows).rstrip("\n")
    breakdown = "\n".join(
        f"- {family}{label}: "
        + ", ".join(f"{name} {count:g}" for name, count in r[key].items())
        for family, r in run["results"].items()
        for key, label in (("per_layer_by_primitive", ""),
                           ("fused_per_layer_by_primitive", ", `--lean-decode fused`"))
        if key in r
    )  # fmt: skip
    return f"""## Ops of a decode step

What: the MLX primitives one decode step of one row builds (the engine's forward, sampling and
the page writes it evaluates), next to mlx-lm's forward of one token over its `KVCache` with a
greedy pick, counted the same way, on small random models. Per layer: the same model at {many}
and at {few} layers, the difference halved. Counted as a GPU builds the graph, on any machine:
each generated kernel and each `mx.fast` op is one node, before `mx.compile` fuses elementwise
chains. MLX spends 6-7 µs of host time per op on the H200, so the count is a decode step's floor.

```bash
mlx-paged bench ops
```

Results: `bench/results/cpu-ops.json` (CPU; the count does not depend on the device).

{summary}

The lean step (`--lean-decode on`, the paged columns) stacks each layer's q/k/v and gate/up
weights, writes each page side with one scatter of flat rows, and takes the decode kernel's
output as the output projection's rows.
The fused step (`--lean-decode fused`, and the default `auto` for llama, mistral, qwen2/3,
phi3 and their MoE forms) also runs each residual add with the RMSNorm after it, the q/k/v
heads' norms and RoPE, and SwiGLU as one generated kernel each (`kernels/layer_kernels.py`).

A paged layer's primitives:

{breakdown}
"""
