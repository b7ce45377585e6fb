"""The memory-density sections of docs/benchmarks.md (`bench memory`)."""

from __future__ import annotations

from .report_table import table as _table


def memory(run: dict) -> str:
    names = {"paged": f"paged (block {run['block_size']})"}
    group = run.get("kv_group_size")
    base = run["results"]["paged"]["sequences_at_budget"]
    for bits in (8, 4):
        if f"paged_kv{bits}" in run["results"]:
            r = run["results"][f"paged_kv{bits}"]
            unbound = r.get("budget_bound_steps", 0) == 0
            bound = " (no request waited: the workload bounds it)" if unbound else ""
            names[f"paged_kv{bits}"] = (
                f"paged, {bits}-bit pages (groups of {group}): "
                f"{r['sequences_at_budget'] / base:.2f}x 16-bit{bound}"
            )
    return f"""## KV memory density

What: how many sequences fit in the same KV memory. Budget {run["budget_tokens"]:,} tokens
({run["budget_bytes"] / 2**20:.0f} MiB of the benchmark model's KV), {run["requests"]}
requests of the seeded workload ({run["workload"]}), a random-weight llama built offline.
Waste = 1 − bytes holding a token / bytes allocated, over every engine step. The paths without
a KV budget run with a decode batch cap of {run["cap"]}; for them "sequences at the budget" is
the budget over their allocation per running sequence. For the paged paths it is the mean
number running over the steps where requests waited for KV, where the budget binds. Quantized
pages run at the same budget in bytes.

```bash
mlx-paged bench memory --kv-bits 16 8 4
```

Results: `bench/results/cpu-memory-density.json` (CPU; memory does not depend on the device).

{memory_table(run, names)}
"""


def memory_table(run: dict, names: dict) -> str:
    """The `bench memory` table: `names` (result key -> label) first, then the two peers."""
    names = {**names, "contiguous": "contiguous, left-padded (`--kv-paged off`)",
             "mlx_lm_batch_generator": "mlx-lm `BatchGenerator`"}  # fmt: skip
    rows = [
        [
            label,
            f"{r['sequences_at_budget']:.1f}",
            str(r["peak_running"]),
            f"{r['allocated_bytes_per_running_seq'] / 2**20:.2f} MiB",
            f"{r['waste_fraction']:.1%}",
            "yes" if r["budget_enforced"] else "no",
        ]
        for key, label in names.items()
        for r in [run["results"][key]]
    ]
    header = ["path", "sequences at the budget", "peak running", "allocated per sequence",
              "KV waste", "budget enforced"]  # fmt: skip
    return _table(header, rows)


def hybrid_memory(run: dict) -> str:
    state = run["state_bytes_per_sequence"]
    token = run["budget_bytes"] // run["budget_tokens"]
    return f"""## KV memory density on a hybrid (Qwen3.5-like)

What: the same workload and measure as the section above, on a random Qwen3.5-like hybrid
(3 Gated DeltaNet layers, 1 full-attention layer; bfloat16): each sequence keeps
{state / 2**10:.0f} KiB of recurrent state (about {state / token:.0f} tokens of its K/V) beside
{token} bytes of K/V a token. Budget {run["budget_tokens"]:,} tokens of K/V
({run["budget_bytes"] / 2**20:.0f} MiB); the paged path spends it on pages and state slots
(at most half), and every path's used bytes count each live sequence's state.

```bash
mlx-paged bench memory --family qwen3_5
```

Results: `bench/results/cpu-memory-density-qwen3_5.json` (CPU).

{memory_table(run, {"paged": f"paged (block {run['block_size']}) + state slots"})}
"""


def window_memory(run: dict) -> str:
    return _window_memory(run, "gemma3", "Gemma-3-like", "")


def gemma4_window_memory(run: dict) -> str:
    model = run["model"]
    shape = f"{model['num_global_key_value_heads']} KV head x {model['global_head_dim']}, K = V"
    return _window_memory(run, "gemma4", "Gemma-4-like", (
        f" Its full-attention layer caches K/V of another shape ({shape}: half a window "
        "layer's bytes a token), so its KV cache group reads the shared page arrays as twice the "
        "pages, and its blocks hold twice the tokens."
    ))  # fmt: skip


def _window_memory(run: dict, family: str, like: str, shapes: str) -> str:
    model = run["model"]
    window, layers = model["sliding_window"], model["num_hidden_layers"]
    full = layers // model["sliding_window_pattern"]
    return f"""## KV memory density with sliding windows ({like})

What: the same workload and measure as above on a random {like} model ({layers - full}
layers with a sliding window of {window} tokens, {full} full-attention; bfloat16).{shapes} Budget
{run["budget_tokens"]:,} tokens of every layer's K/V ({run["budget_bytes"] / 2**20:.0f} MiB).
With KV cache groups (the default) the window layers' blocks go back to the pool once their
window has passed them; "one group" keeps every layer's blocks for the whole sequence. A
sequence needs every token in the full-attention layers and its last {window} in the others:
that is its used memory, on every path. The paged paths' sequences at the budget are those
decoding while requests wait; prompts being prefilled hold the rest of the pool (the full
group takes a whole prompt at admission), which is why they run fewer than their allocation
per sequence would allow, and fewer than the peers' estimate from theirs.

```bash
mlx-paged bench memory --family {family} --requests 48 --budget-tokens 4096
```

Results: `bench/results/cpu-memory-density-{family}.json` (CPU).

{
        memory_table(
            run,
            {
                "paged": f"paged (block {run['block_size']}), KV cache groups",
                "paged_one_group": "paged, one group (windows keep their pages)",
            },
        )
    }
"""


def latent_memory(run: dict) -> str:
    model = run["model"]
    latent, rope = model["kv_lora_rank"], model["qk_rope_head_dim"]
    heads = model["num_attention_heads"]
    expanded = heads * (model["qk_nope_head_dim"] + rope + model["v_head_dim"])
    return f"""## KV memory density with latent attention (DeepSeek-V3-like)

What: the same workload and measure as above on a random DeepSeek-V3-like model with
multi-head latent attention ({model["num_hidden_layers"]} layers; bfloat16): a token keeps a
latent row of {latent} and a RoPE key row of {rope} a layer on latent pages, as in mlx-lm's own
MLA caches, where per-head keys and values would take {expanded} values
({expanded / (latent + rope):.1f}x). Budget {run["budget_tokens"]:,} tokens of latent rows
({run["budget_bytes"] / 2**20:.0f} MiB); quantized pages quantize the latent and the RoPE keys
each in groups of {run["kv_group_size"]}. A prompt's blocks are taken when it is admitted, so the
more a pool holds the more of it goes to prompts still being prefilled (the KV waste column):
on this workload 4-bit pages run about as many sequences as 8-bit ones.

```bash
{_latent_command(run)}
```

Results: `bench/results/cpu-memory-density-deepseek_v3.json` (CPU).

{memory_table(run, _latent_names(run))}
"""


def _latent_command(run: dict) -> str:
    return (f"mlx-paged bench memory --family deepseek_v3 --requests {run['requests']} "
            f"--budget-tokens {run['budget_tokens']} --kv-bits 16 8 4")  # fmt: skip


def _latent_names(run: dict) -> dict:
    base = run["results"]["paged"]["sequences_at_budget"]
    names = {"paged": f"paged latent pages (block {run['block_size']})"}
    for bits in (8, 4):
        key = f"paged_kv{bits}"
        if key in run["results"]:
            seqs = run["results"][key]["sequences_at_budget"]
            names[key] = f"paged, {bits}-bit latent pages: {seqs / base:.2f}x 16-bit"
    return names
