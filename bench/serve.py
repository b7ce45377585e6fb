"""`mlx-paged bench serve`: our server and a peer (default `mlx_lm.server`) on the same model,
the same prompts and the same load, one after the other in one run, plus our offline throughput
(`LLM.generate`) on the same workload.

Each concurrency level sends max(`--min-requests`, 2 x concurrency) streamed completions with
that many in flight; each `--rate` sends `--min-requests` at Poisson arrivals. Every level gets
prompts of its own, unique from their first token, so no level hits a prefix cache that an
earlier one filled. Before each level, a server gets a warm-up wave of its own prompts at that
level's concurrency (at least `--warm-up` requests, 8 tokens each), so the level measures steady
state and not the first traces of new batch shapes; the offline engine gets the same.
"""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlx_paged.progress import progress

from .output import device_name, write_result
from .serve_interference import measure
from .serve_load import request_body, run_concurrency, run_rate, summarize
from .serve_report import plot, print_table
from .serve_servers import free_port, ours_command, peer_command, running_server


def main(args) -> int:
    """Run the load against each server and offline; writes `args.out` (and a PNG beside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        model = _model_path(args, Path(tmp))
        workload = _workload(model, args)
        result = {"model": args.model or ("random llama 1B" if args.random_llama else "SmolLM2"),
                  "device": device_name(),
                  "mlx": mx.__version__, "machine": platform.machine(),
                  "workload": _describe(args), "servers": {}, "offline": {}}  # fmt: skip
        most = max([*args.concurrency, args.long_prompt_streams + 1 if args.long_prompt else 1])
        servers = {"mlx-paged": lambda port: ours_command(model, port, most, args.ours_args)}
        if args.peer != "none":
            servers[args.peer_name] = lambda port: peer_command(args.peer, model, port, most)
        for name, command in servers.items():
            levels, interference = _measure_server(name, command, workload, args, tmp)
            result["servers"][name] = levels
            if interference:
                result.setdefault("long_prompt", {})[name] = interference
        if not args.no_offline:
            result["offline"] = _offline(model, workload, args)
    print_table(result)
    out = write_result(result, args.out)
    plot(result, out.with_suffix(".png"))
    return 0


def _model_path(args, tmp: Path) -> str:
    if args.random_llama:
        from .random_models import ONE_B, build_random_llama

        print("building a random llama 1B...", flush=True)
        # A context long enough for `--long-prompt` (RoPE needs no table of positions).
        config = {**ONE_B, "max_position_embeddings": 32768}
        return str(build_random_llama(tmp / "llama-1b-random", config))
    from mlx_paged.models.loader import resolve_model

    return resolve_model(args.model)[0]


def _describe(args) -> dict:
    return {"prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
            "concurrency": args.concurrency, "rates": args.rate,
            "min_requests": args.min_requests, "ours_args": args.ours_args,
            "peer": args.peer, "long_prompt": args.long_prompt,
            "long_prompt_streams": args.long_prompt_streams,
            "long_prompt_stream_tokens": args.long_prompt_stream_tokens}  # fmt: skip


def _workload(model: str, args) -> dict:
    """Prompts per level, text of about `args.prompt_tokens` tokens each, all distinct."""
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(Path(model))
    rng = np.random.default_rng(args.seed)
    vocab = len(tokenizer.get_vocab())
    special = set(tokenizer.all_special_ids)

    def prompt(length: int) -> str:
        ids = [int(t) for t in rng.integers(100, vocab - 100, length + 8)]
        ids = [t for t in ids if t not in special]
        return tokenizer.decode(tokenizer.encode(tokenizer.decode(ids))[:length])

    def requests(n: int, max_tokens: int) -> list[dict]:
        return [request_body(model, prompt(args.prompt_tokens), max_tokens) for _ in range(n)]

    levels = {f"concurrency {c}": requests(max(args.min_requests, 2 * c), args.max_tokens)
              for c in args.concurrency}  # fmt: skip
    levels.update({f"rate {r}": requests(args.min_requests, args.max_tokens) for r in args.rate})
    warm_up = {level: requests(max(args.warm_up, _in_flight(level)), 8) for level in levels}
    workload = {"warm_up": warm_up, "levels": levels}
    if args.long_prompt:
        workload["streams"] = requests(args.long_prompt_streams, args.long_prompt_stream_tokens)
        workload["long"] = request_body(model, prompt(args.long_prompt), 1)
    return workload


def _in_flight(level: str) -> int:
    kind, value = level.split()
    return int(value) if kind == "concurrency" else 1


def _measure_server(name: str, command, workload: dict, args, tmp: str):
    """Start the server (`command(port)`), warm it up, run every level and the long-prompt
    run, stop it; (levels, long-prompt result or None)."""
    port = free_port()
    command = command(port)
    print(f"== {name}: {' '.join(command)}", flush=True)
    logs = Path(args.logs or tmp)
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{name.replace('/', '_')}.log"
    out = {}
    with running_server(command, port, log, timeout=args.start_timeout) as url:
        levels = workload["levels"].items()
        for level, bodies in progress(levels, f"{name}: load levels", unit="level"):
            warm_up = workload["warm_up"][level]
            run_concurrency(url, warm_up, max(_in_flight(level), 1), args.timeout)
            kind, value = level.split()
            if kind == "concurrency":
                records, wall = run_concurrency(url, bodies, int(value), args.timeout)
            else:
                records, wall = run_rate(url, bodies, float(value), args.timeout, args.seed)
            out[level] = summarize(records, wall)
            s = out[level]
            print(f"  {level}: {s['output_tok_s']:.1f} out tok/s, TTFT p50 "
                  f"{_ms(s['ttft_ms']['p50'])}, ITL p50/p99 {_ms(s['itl_ms']['p50'])}/"
                  f"{_ms(s['itl_ms']['p99'])}, errors {s['errors']}", flush=True)  # fmt: skip
        interference = None
        if args.long_prompt:
            interference = measure(url, workload["streams"], workload["long"], args.timeout)
            during, outside = interference["itl_during_ms"], interference["itl_outside_ms"]
            print(f"  a {args.long_prompt}-token prompt among {args.long_prompt_streams} streams: "
                  f"ITL p99 during its prefill {_ms(during['p99'])}, p50 outside "
                  f"{_ms(outside['p50'])}; its TTFT {_ms(interference['long_prompt_ttft_ms'])}",
                  flush=True)  # fmt: skip
    return out, interference


def _offline(model: str, workload: dict, args) -> dict:
    """Output tok/s of `LLM.generate` on each concurrency level's prompts, that many at a
    time, with the engine flags of `--ours-args`: the level's prompts run once to warm up
    (prefix caching off, so the timed run computes them again), then once timed."""
    from mlx_paged import LLM, SamplingParams

    out = {}
    for c in progress(args.concurrency, "offline throughput", unit="level"):
        llm = LLM(model, **_engine_kwargs(args.ours_args, c))
        bodies = workload["levels"][f"concurrency {c}"]
        params = SamplingParams(max_tokens=args.max_tokens)
        llm.generate([b["prompt"] for b in bodies], params)
        tic = time.perf_counter()
        results = llm.generate([b["prompt"] for b in bodies], params)
        wall = time.perf_counter() - tic
        tokens = sum(len(r.token_ids) for r in results)
        out[f"concurrency {c}"] = {"output_tokens": tokens, "output_tok_s": tokens / wall}
        print(f"  offline, concurrency {c}: {tokens / wall:.1f} out tok/s", flush=True)
        llm.engine.shutdown()
        del llm
        mx.clear_cache()
    return out


def _engine_kwargs(ours_args: str, concurrency: int) -> dict:
    """`LLM` keyword arguments for `mlx-paged serve` flags."""
    import argparse
    import dataclasses
    import shlex

    from mlx_paged.cli.serve import engine_config
    from mlx_paged.cli.serve_args import add_serve_args

    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    # At most `concurrency` in flight: the engine never decodes fewer than it prefills at once.
    flags = ["--decode-concurrency", str(concurrency), "--prompt-concurrency",
             str(min(8, concurrency)), *shlex.split(ours_args), "--no-prefix-caching"]  # fmt: skip
    config = dataclasses.asdict(engine_config(parser.parse_args(flags)))
    config.pop("max_model_len")
    return config


def _ms(value) -> str:
    return "-" if value is None else f"{value:.1f} ms"
