"""The docs/benchmarks.md sections of the agents' features: structured output's cost
(`bench structured`) and speculative decoding's gain (`bench speculative`)."""

from __future__ import annotations

from .report_table import table as _table

STRUCTURED_RUN = "h100-structured-llama1b.json"
SPECULATIVE_RUN = "h100-speculative-smollm2.json"


def structured(run: dict) -> str:
    """The structured-output section: each round's two arms and the medians."""
    w = run["workload"]
    rows = []
    for i, r in enumerate(run["rounds"]):
        free, schema = r["free"], r["json_schema"]
        parsed = f"{schema['stopped_outputs_parsed']} / {schema['finish_reasons'].get('stop', 0)}"
        rows.append([str(i + 1), f"{free['output_tok_s']:,.0f}", f"{schema['output_tok_s']:,.0f}",
                     f"{schema['output_tok_s'] / free['output_tok_s']:.2f}x", parsed,
                     str(free["errors"] + schema["errors"])])  # fmt: skip
    rows.append(["median", f"{run['free_tok_s']:,.0f}", f"{run['json_schema_tok_s']:,.0f}",
                 f"{run['ratio']:.2f}x", "", ""])  # fmt: skip
    header = ["round", "free tok/s", "json_schema tok/s", "constrained / free",
              "schema outputs that stopped and parse", "errors"]  # fmt: skip
    return f"""## Structured output under load

What: output tokens/s of `mlx-paged serve` on a {run["model"]} with a JSON schema
(`response_format` `json_schema`, strict) on every request, against the same requests without
one, {w["concurrency"]} at once, {w["requests"]} requests of {w["prompt_tokens"]} prompt tokens
and up to {w["max_tokens"]} output tokens a round, temperature 1, the arms alternating each
round. The grammar's masks fill on a worker thread while the forward is encoded, and apply to
the logits on the device before sampling.

```bash
mlx-paged bench structured --random-llama --rounds {w["rounds"]}
```

Results: `bench/results/{STRUCTURED_RUN}` ({run["device"]}, MLX {run["mlx"]}).

{_table(header, rows)}
"""


def speculative(run: dict) -> str:
    """The speculative-decoding section: one row per workload, concurrency and drafter."""
    w = run["workload"]
    kinds = [k for k in ("ngram", "draft") if all(k in r for r in run["rows"])]
    rows = []
    for r in run["rows"]:
        for kind in kinds:
            s = r[kind]
            acceptance = "-" if s["acceptance"] is None else f"{s['acceptance']:.0%}"
            rows.append([r["workload"], str(r["concurrency"]), kind, f"{r['plain_tok_s']:,.0f}",
                         f"{s['tok_s']:,.0f}", f"{s['ratio']:.2f}x", acceptance,
                         "yes" if s["outputs_equal"] else "no"])  # fmt: skip
    header = ["workload", "concurrency", "drafter", "plain tok/s", "speculative tok/s", "ratio",
              "acceptance", "greedy outputs equal"]  # fmt: skip
    return f"""## Speculative decoding

What: output tokens/s of `LLM.generate` on {run["model"]}, greedy, up to {w["max_tokens"]}
tokens, with drafts of up to {w["num_draft_tokens"]} tokens against plain decoding in the same
run, median of {w["rounds"]} rounds after a warm-up. Copy-heavy prompts ask to repeat or edit
text and code given in the prompt; free-form ones ask for a story. Acceptance is accepted over
drafted tokens; the outputs must equal plain decoding's token for token.

```bash
mlx-paged bench speculative
```

Results: `bench/results/{SPECULATIVE_RUN}` ({run["device"]}, MLX {run["mlx"]}).

{_table(header, rows)}
"""
