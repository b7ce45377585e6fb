"""`mlx-paged bench speculative`: decode tok/s with prompt lookup drafts (`--draft-model
ngram`) against plain decoding, on one model in one process, for a copy-heavy workload (a text
or a function to write out again) and a free-form one (a story).

Each workload runs at each concurrency: that many greedy requests in one `generate` call, on
engines built alike but for the drafter (none, prompt lookup, and `--draft-model` if given),
in turn for `--rounds` rounds; the table reports medians of output tokens per second (prefill
included, the same for all), each drafter's ratio to plain decoding, the drafts' acceptance
rate, and whether every output equals plain decoding's. The texts come
from Python's standard library (docstrings and functions), so nothing is downloaded.
"""

from __future__ import annotations

import inspect
import json
import platform
import statistics
import textwrap
import time

import mlx.core as mx

from mlx_paged.progress import progress

from .output import device_name, write_result

STORIES = ["a lighthouse keeper who finds a map", "a robot learning to paint",
           "two rival bakers in a small town", "a storm over a mountain village"]  # fmt: skip


def _sources() -> list[tuple[str, str]]:
    """(docstring, function source) pairs from the standard library."""
    import collections
    import json as json_module
    import textwrap as textwrap_module

    functions = [json_module.dumps, textwrap_module.fill, collections.namedtuple,
                 inspect.getsource, json_module.loads, textwrap_module.indent]  # fmt: skip
    return [(inspect.getdoc(f) or "", inspect.getsource(f)) for f in functions]


def workloads(n: int, tokenizer) -> dict[str, list[list[int]]]:
    """`n` prompts per workload, as token ids. The copy-heavy ones are plain text that starts
    the copy (a text or a function, then the same again after a heading, its first line
    given), the free-form ones chat requests for a story."""
    sources = _sources()
    copy, free = [], []
    for i in range(n):
        doc, code = sources[i % len(sources)]
        if i % 2 == 0:
            text = doc[:1500]
            start = f"{text}\n\nThe same text once more, word for word:\n\n"
        else:
            text = textwrap.dedent(code)[:1500]
            start = f"```python\n{text}\n```\n\nThe same function, unchanged:\n\n```python\n"
        copy.append(tokenizer.encode(start + text.splitlines()[0]))
        story = [{"role": "user", "content": f"Write a story about {STORIES[i % len(STORIES)]}."}]
        free.append(tokenizer.apply_chat_template(story, add_generation_prompt=True))
    return {"copy-heavy": copy, "free-form": free}


def main(args) -> int:
    """Run every workload and concurrency on both engines; writes `args.out`."""
    from mlx_paged import LLM
    from mlx_paged.models.loader import resolve_model

    model = resolve_model(args.model)[0]
    flags = dict(max_num_seqs=max(args.concurrency), enable_prefix_caching=False)
    engines = {"plain": LLM(model, **flags),
               "ngram": LLM(model, draft_model="ngram",
                            num_draft_tokens=args.num_draft_tokens, **flags)}  # fmt: skip
    if args.draft_model:
        engines["draft"] = LLM(model, draft_model=args.draft_model,
                               num_draft_tokens=args.num_draft_tokens, **flags)  # fmt: skip
    tokenizer = engines["plain"].tokenizer
    rows = []
    for name, prompts in workloads(max(args.concurrency), tokenizer).items():
        for concurrency in args.concurrency:
            rows.append(_measure(engines, name, concurrency, prompts[:concurrency], args))
    result = {"model": args.model or "SmolLM2-135M-Instruct", "device": device_name(),
              "mlx": mx.__version__, "machine": platform.machine(),
              "workload": {"max_tokens": args.max_tokens, "rounds": args.rounds,
                           "draft_model": args.draft_model,
                           "num_draft_tokens": args.num_draft_tokens,
                           "concurrency": args.concurrency},
              "rows": rows}  # fmt: skip
    write_result(result, args.out)
    return 0


def _measure(engines: dict, name: str, concurrency: int, prompts, args) -> dict:
    """Every engine on `prompts` for `args.rounds` rounds after a warm-up; one table row: each
    speculating engine's tok/s, its ratio to plain decoding's, acceptance and equal outputs."""
    from mlx_paged import SamplingParams

    params = SamplingParams(max_tokens=args.max_tokens)
    rates = {kind: [] for kind in engines}
    outputs, counted = {}, {}
    for timed in progress(range(args.rounds + 1), f"{name}, {concurrency} at once",
                          unit="round"):  # fmt: skip
        for kind, llm in engines.items():
            runner = llm.engine.runner
            if timed == 1:  # after the warm-up: count this workload's drafts only
                counted[kind] = (runner.spec_draft_tokens, runner.spec_accepted_tokens)
            tic = time.perf_counter()
            results = llm.generate(prompts, params)
            seconds = time.perf_counter() - tic
            outputs[kind] = [r.token_ids for r in results]
            if timed:
                rates[kind].append(sum(len(t) for t in outputs[kind]) / seconds)
    row = {"workload": name, "concurrency": concurrency,
           "plain_tok_s": statistics.median(rates["plain"]), "rates": rates}  # fmt: skip
    for kind in [k for k in engines if k != "plain"]:
        runner = engines[kind].engine.runner
        drafted = runner.spec_draft_tokens - counted[kind][0]
        accepted = runner.spec_accepted_tokens - counted[kind][1]
        row[kind] = {"tok_s": statistics.median(rates[kind]),
                     "ratio": statistics.median(rates[kind]) / row["plain_tok_s"],
                     "acceptance": accepted / drafted if drafted else None,
                     "drafted_tokens": drafted,
                     "outputs_equal": outputs[kind] == outputs["plain"]}  # fmt: skip
        print(f"  {name}, concurrency {concurrency}, {kind}: {row[kind]['tok_s']:.1f} tok/s "
              f"against {row['plain_tok_s']:.1f} ({row[kind]['ratio']:.2f}x), acceptance "
              f"{json.dumps(row[kind]['acceptance'])}, outputs equal: "
              f"{row[kind]['outputs_equal']}", flush=True)  # fmt: skip
    return row
