"""`mlx-paged bench structured`: our server's output tok/s with a JSON schema on every request
against none, on one server and one load, in alternating rounds.

Each round sends `--requests` streamed `/v1/completions` with `--concurrency` in flight, once
free and once with `response_format` json_schema (strict, `SCHEMA`), on prompts of their own
(distinct from the first token, so no prefix is cached across them). Sampling is at temperature
1 (unseeded: a seeded request runs alone); `SCHEMA` asks for more records than `--max-tokens`
holds, so on a random model both arms decode to the token limit and the ratio is the cost of
constraining alone. Every arm is warmed up before the first round (batch shapes, the schema's
grammar).
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_paged.progress import progress

from .output import device_name, write_result
from .serve_load import request_body, run_concurrency, summarize
from .serve_servers import free_port, ours_command, running_server

# Records of a few typed fields, more of them than a request's tokens hold.
SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "minItems": 200,
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 24},
                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                    "role": {"enum": ["admin", "editor", "viewer"]},
                    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                },
                "required": ["name", "age", "role", "tags"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["people"],
    "additionalProperties": False,
}
ARMS = ("free", "json_schema")


def main(args) -> int:
    """Run the rounds on one server; writes `args.out`."""
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_path(args, Path(tmp))
        prompts = _prompts(model, args)
        port = free_port()
        command = ours_command(model, port, args.concurrency, args.ours_args)
        print(f"== mlx-paged: {' '.join(command)}", flush=True)
        log = Path(args.logs or tmp) / "mlx-paged.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with running_server(command, port, log, timeout=args.start_timeout) as url:
            for arm in ARMS:  # batch shapes and the grammar, before anything is timed
                run_concurrency(url, _bodies(model, arm, prompts.pop(), 8), args.concurrency,
                                args.timeout)  # fmt: skip
            rounds = []
            for _ in progress(range(args.rounds), "structured output rounds", unit="round"):
                rounds.append(_round(url, model, prompts, args))
    result = {"model": args.model or ("random llama 1B" if args.random_llama else "SmolLM2"),
              "device": device_name(), "mlx": mx.__version__, "machine": platform.machine(),
              "workload": _describe(args), "schema": SCHEMA, "rounds": rounds,
              **_medians(rounds)}  # fmt: skip
    print(f"output tok/s, median of {args.rounds} rounds: free {result['free_tok_s']:,.1f}, "
          f"json_schema {result['json_schema_tok_s']:,.1f} ({result['ratio']:.2f}x)")  # fmt: skip
    write_result(result, args.out)
    return 0


def _round(url: str, model: str, prompts: list, args) -> dict:
    """Both arms once, each on prompts of its own; per arm its load summary, finish reasons,
    how many of the outputs that stopped parse as JSON objects, and the start of one output."""
    out = {}
    for arm in ARMS:
        bodies = _bodies(model, arm, prompts.pop(), args.max_tokens)
        records, wall = run_concurrency(url, bodies, args.concurrency, args.timeout)
        summary = summarize(records, wall)
        stopped = [r.text for r in records if r.error is None and r.finish_reason == "stop"]
        summary["finish_reasons"] = dict(Counter(r.finish_reason for r in records))
        summary["stopped_outputs_parsed"] = sum(_is_object(text) for text in stopped)
        summary["sample_output"] = records[0].text[:300]
        out[arm] = summary
        print(f"  {arm}: {summary['output_tok_s']:,.1f} out tok/s, "
              f"{summary['output_tokens'] / max(1, len(records)):.0f} tokens a request, "
              f"errors {summary['errors']}", flush=True)  # fmt: skip
    return out


def _medians(rounds: list[dict]) -> dict:
    """Median tok/s of each arm, their ratio, and the ratio of each round's pair."""
    free = statistics.median(r["free"]["output_tok_s"] for r in rounds)
    constrained = statistics.median(r["json_schema"]["output_tok_s"] for r in rounds)
    paired = [r["json_schema"]["output_tok_s"] / r["free"]["output_tok_s"] for r in rounds]
    return {"free_tok_s": free, "json_schema_tok_s": constrained,
            "ratio": constrained / free, "paired_ratios": paired}  # fmt: skip


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _bodies(model: str, arm: str, prompts: list[str], max_tokens: int) -> list[dict]:
    """Streamed completions of `prompts`, sampled at temperature 1; the json_schema arm's
    with `SCHEMA` as their strict response format."""
    bodies = []
    for prompt in prompts:
        body = {**request_body(model, prompt, max_tokens), "temperature": 1.0}
        if arm == "json_schema":
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "people", "schema": SCHEMA, "strict": True},
            }
        bodies.append(body)
    return bodies


def _prompts(model: str, args) -> list[list[str]]:
    """Distinct prompts of about `args.prompt_tokens` tokens: one set per arm of each round and
    of the warm-up."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(Path(model))
    rng = np.random.default_rng(args.seed)
    vocab, special = len(tokenizer.get_vocab()), set(tokenizer.all_special_ids)

    def prompt() -> str:
        ids = [int(t) for t in rng.integers(100, vocab - 100, args.prompt_tokens + 8)]
        text = tokenizer.decode([t for t in ids if t not in special])
        return tokenizer.decode(tokenizer.encode(text)[: args.prompt_tokens])

    sets = len(ARMS) * (args.rounds + 1)
    return [[prompt() for _ in range(args.requests)] for _ in range(sets)]


def _model_path(args, tmp: Path) -> str:
    if args.random_llama:
        from .random_models import ONE_B, build_random_llama

        print("building a random llama 1B with a byte-level tokenizer...", flush=True)
        return str(build_random_llama(tmp / "llama-1b-random", ONE_B, byte_level=True))
    from mlx_paged.models.loader import resolve_model

    return resolve_model(args.model)[0]


def _describe(args) -> dict:
    return {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "concurrency": args.concurrency, "requests": args.requests,
            "rounds": args.rounds, "ours_args": args.ours_args}  # fmt: skip
