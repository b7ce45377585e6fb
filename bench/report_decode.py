"""The end-to-end decode section of docs/benchmarks.md: one row per batch of the
`bench decode` runs, with the fraction of the bytes-per-step floor reached."""

from __future__ import annotations

from .report_table import table as _table

DECODE_RUNS = tuple(f"h100-decode-llama1b-b{b}.json" for b in (1, 8, 64))
DECODE_METHODS = {
    "paged_kernel": "paged + kernel, lean step (`--lean-decode on`, compiled)",
    "paged_kernel_lean_fused": "paged + kernel, fused step (the default, compiled)",
    "paged_kernel_eager": "paged + kernel, steps built eagerly",
    "paged_kernel_mlx_lm_forward": "paged + kernel, mlx-lm's forward (`--lean-decode off`)",
    "paged_kernel_fused_rope": "paged + `decode_rope` kernel, compiled",
    "paged_kernel_fused_rope_eager": "paged + `decode_rope` kernel, eager",
    "batch_generator": "mlx-lm `BatchGenerator`",
}
# Copy bandwidth by device, as `bench kernels` measured it; runs on other devices get no floor.
COPY_BYTES_PER_S = {"NVIDIA H200": 4.3e12}
# The engine's default decode step (`--lean-decode auto`), the method the headline quotes.
DEFAULT_METHOD = "paged_kernel_lean_fused"


def default_method(run: dict) -> dict:
    """The run's figures for the engine's default step (the lean step in older runs)."""
    methods = run["methods"]
    return methods[DEFAULT_METHOD] if DEFAULT_METHOD in methods else methods["paged_kernel"]


def decode_floor_tok_s(run: dict) -> float:
    """Tokens/s if a step only read the weights once and each row's KV once, at copy speed."""
    from .random_models import ONE_B as c

    kv_dim = c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"]
    layer = 2 * c["hidden_size"] ** 2 + 2 * c["hidden_size"] * kv_dim
    layer += 3 * c["hidden_size"] * c["intermediate_size"]
    weights = 2 * (c["num_hidden_layers"] * layer + c["vocab_size"] * c["hidden_size"])
    context = run["prompt_tokens"] + run["new_tokens"] / 2
    kv = 2 * 2 * c["num_hidden_layers"] * kv_dim * context * run["batch"]
    return run["batch"] * COPY_BYTES_PER_S[run["device"]] / (weights + kv)


# The parts of a decode step's host time that the engine counts (`EngineMetrics`), and the
# split `bench decode` records: those parts and the rest.
HOST_PARTS = ("build", "dispatch", "deliver")
HOST_SPLIT = (*HOST_PARTS, "other")


def _missing_note(runs: tuple, present: list[str]) -> str:
    """Which runs left out a method that others have (a column needs every batch's run)."""
    missing = [
        f"`{k}` at batch {r['batch']}"
        for r in runs for k in DECODE_METHODS
        if k not in present and k not in r["methods"] and any(k in o["methods"] for o in runs)
    ]  # fmt: skip
    if not missing:
        return ""
    return (f"Not run, so without a column: {', '.join(missing)} (every method's engine stays "
            "loaded for the whole run: where they and `BatchGenerator` did not fit the card's "
            "memory, the run left one out).\n\n")  # fmt: skip


def _methods_run(runs: tuple) -> list[str]:
    """The engine methods any of `runs` timed, in the table's order (the command's list)."""
    engines = [k for k in DECODE_METHODS if k != "batch_generator"]
    return [k for k in engines if any(k in r["methods"] for r in runs)]


def decode(*runs: dict) -> str:
    present = [k for k in DECODE_METHODS if all(k in r["methods"] for r in runs)]
    split = all("build_ms_per_step" in default_method(r) for r in runs)
    floor = all(r["device"] in COPY_BYTES_PER_S for r in runs)
    rows = []
    for run in runs:
        m = run["methods"]
        cells = [f"{m[k]['decode_tok_s']:,.0f}" for k in present]
        best = default_method(run)
        rows.append(
            [str(run["batch"]), *cells, f"{best['vs_batch_generator']:.2f}x",
             f"{best['host_ms_per_step']:.2f} / {best['wait_ms_per_step']:.2f}",
             *([" / ".join(f"{best[f'{p}_ms_per_step']:.2f}" for p in HOST_SPLIT)] if split
               else []),
             *([f"{best['decode_tok_s'] / decode_floor_tok_s(run):.0%}"] if floor else [])]
        )  # fmt: skip
    header = ["batch", *(DECODE_METHODS[k] for k in present), "default step vs BatchGenerator",
              "host / wait ms per step",
              *(["host: build / dispatch / deliver / other ms"] if split else []),
              *(["of the bytes floor"] if floor else [])]  # fmt: skip
    run = runs[-1]
    repeats = " / ".join(str(r["repeats"]) for r in runs)
    batches = " / ".join(str(r["batch"]) for r in runs)
    floor_note = (
        " The bytes floor reads the weights and every row's KV once per step at copy speed."
        if floor
        else ""
    )
    files = ", ".join(f"`bench/results/{name}`" for name in DECODE_RUNS)
    return f"""## End-to-end decode throughput

What: decode tokens/s of the whole engine on a {run["model"]}, prompts of
{run["prompt_tokens"]} random tokens, {run["new_tokens"]} new tokens each (EOS ignored),
prefix caching off. Decode tokens/s = batch × (new − 1) / (time for all new tokens − time for
one), so every method pays the same prefill; median of {repeats} rounds (batch {batches})
after a warm-up run. "host" is the engine thread's time per decode step outside waiting
for the device (building the step in Python and MLX's encoding of each node of its graph);
"wait" is its time blocked on the device: near zero means the device waits for the host. The
host time's parts as the engine counts them (`mlx_paged_decode_*_seconds_total`): building
the step's graph, MLX's dispatch of it (`mx.async_eval`), delivering its tokens, and the
rest, for the default step.{floor_note}

```bash
mlx-paged bench decode --batch B --repeats R --methods {" ".join(_methods_run(runs))}
```

{_missing_note(runs, present)}Results: {files} ({run["device"]},
MLX {run["mlx"]}).

{_table(header, rows)}
"""


HYBRID_DECODE_RUN = "h200-decode-qwen3_5-1b-b64.json"


def hybrid_decode(run: dict) -> str:
    """The hybrid model's decode run, every sample shown."""
    m = run["methods"]
    paged = m["paged_kernel"]
    rows = [
        [name, f"{m[name]['decode_tok_s']:,.0f}",
         ", ".join(f"{s:,.0f}" for s in m[name]["samples"]),
         f"{m[name]['vs_batch_generator']:.2f}x"]
        for name in ("paged_kernel", "batch_generator")
    ]  # fmt: skip
    header = ["method", "decode tok/s (median)", "rounds", "vs BatchGenerator"]
    return f"""## Hybrid decode throughput

What: the end-to-end decode measure above on a {run["model"]}, batch {run["batch"]}, prompts
of {run["prompt_tokens"]} random tokens, {run["new_tokens"]} new tokens each, median of
{run["repeats"]} rounds. The paged engine runs the Gated DeltaNet layers on the generated
recurrence kernel (`kernels/gated_delta.jinja`), {_steps_on(paged)}; BatchGenerator runs
mlx-lm's loop of ops over the timesteps, as mlx-lm does on CUDA. The paged engine's steps are
bound by the host: {paged["host_ms_per_step"]:.2f} ms of host work a step (MLX's cost per
operation and the engine's Python), {paged["wait_ms_per_step"]:.2f} ms waiting for the device.

```bash
mlx-paged bench decode --random-model qwen3_5-1b --batch 64 --prompt 128 --new 512 \\
    --repeats 5 --methods paged_kernel
```

Results: `bench/results/{HYBRID_DECODE_RUN}` ({run["device"]}, MLX {run["mlx"]}).

{_table(header, rows)}
"""


def _steps_on(paged: dict) -> str:
    """Which kernel ran the run's decode steps, from its counted calls."""
    if paged.get("attention_calls", {}).get("gated_delta_step_kernel/decode"):
        return "and the decode steps on the whole-step kernel (`kernels/gated_delta_step.jinja`)"
    return "prompts and steps alike"
