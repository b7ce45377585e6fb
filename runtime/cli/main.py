"""`mlx-paged` command line: serve, bench, kernels."""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys

from mlx_paged.engine.config import EngineConfig

logger = logging.getLogger("mlx_paged")

API_KEY_ENV = "MLX_PAGED_API_KEY"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_size(text: str) -> int:
    """Parse `4GB`, `512MiB`, `1e9`-free plain byte counts into bytes."""
    m = _SIZE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 4GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(float(m.group(1)) * _UNITS[unit])


def _on_off(text: str) -> bool:
    value = text.lower()
    if value in ("on", "true", "1", "yes"):
        return True
    if value in ("off", "false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError("expected on or off")


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="mlx-lm model folder or hub name (default: the embedded "
        "SmolLM2-135M-Instruct, prepared on first use)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to bind (default 8080)")
    p.add_argument(
        "--max-tokens",
        type=_positive,
        default=512,
        help="default max tokens per response (default 512)",
    )
    p.add_argument("--temp", type=float, default=0.0, help="default temperature (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="default top-p (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="default top-k, 0 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="default min-p, 0 = off")
    p.add_argument(
        "--decode-concurrency",
        type=_positive,
        default=32,
        help="most requests decoding at once (default 32)",
    )
    p.add_argument(
        "--prompt-concurrency",
        type=_positive,
        default=8,
        help="most requests prefilling at once (default 8)",
    )
    p.add_argument(
        "--prefill-step-size",
        type=_positive,
        default=2048,
        help="prompt tokens per request per step (default 2048)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template (text) that replaces the model's",
    )
    p.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    )
    p.add_argument(
        "--kv-paged",
        type=_on_off,
        nargs="?",
        const=True,
        default=True,
        metavar="{on,off}",
        help="paged KV, or the contiguous path that is token-exact with mlx-lm's "
        "BatchGenerator (default on); bare --kv-paged means on",
    )
    p.add_argument(
        "--block-size",
        type=int,
        choices=[8, 16, 32],
        default=16,
        help="KV block size in tokens for the paged path (default 16)",
    )
    p.add_argument(
        "--kv-budget",
        type=parse_size,
        default=None,
        help="KV pool size for the paged path, e.g. 4GB (default: 10%% of device memory)",
    )
    p.add_argument(
        "--num-blocks",
        type=_positive,
        default=None,
        help="KV pool size in blocks (wins over --kv-budget)",
    )
    p.add_argument(
        "--paged-attention",
        choices=["auto", "kernel", "reference"],
        default="auto",
        help="decode attention over pages: the generated Metal/CUDA kernel on a GPU "
        "(auto, the default; 'kernel' fails without one) or gather + SDPA "
        "('reference', also the CPU path)",
    )
    p.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="turn off automatic prefix caching (paged path)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer <key>' on /v1 and /metrics (visible to "
        f"other local users in ps: prefer {API_KEY_ENV} or --api-key-file)",
    )
    p.add_argument(
        "--api-key-file", default=None, help="read the API key from this file (its first line)"
    )
    p.add_argument(
        "--max-request-bytes",
        type=parse_size,
        default=4 * 1024 * 1024,
        help="largest accepted request body (default 4MiB)",
    )
    p.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=30.0,
        help="seconds a client has to send a whole request, headers and body, and "
        "that an idle keep-alive connection stays open (default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=_positive,
        default=512,
        help="most open client connections; at the cap a new one replaces the "
        "longest idle one, or gets 503 when all are busy (default 512)",
    )
    p.add_argument("--allowed-origins", default="*", help="CORS allowed origins (default *)")
    p.add_argument(
        "--shutdown-grace",
        type=_non_negative_float,
        default=10.0,
        help="seconds in-flight requests get to finish on Ctrl-C/SIGTERM (default 10)",
    )


def resolve_api_key(args: argparse.Namespace) -> str | None:
    """The API key from --api-key, --api-key-file or the environment, in that order of
    precedence; at most one of the flags may be given."""
    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("give either --api-key or --api-key-file, not both")
    if args.api_key_file is not None:
        with open(args.api_key_file, encoding="utf-8") as f:
            key = f.readline().strip()
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file}: the file is empty")
        return key
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise ValueError("the API key is empty")
    return key


def serve(args: argparse.Namespace) -> int:
    """Load the model, start the engine thread and serve HTTP until a signal arrives."""
    from mlx_paged.server.lifecycle import serve_until_signal
    from mlx_paged.server.listener import make_server
    from mlx_paged.server.state import ServerState

    try:
        api_key = resolve_api_key(args)
    except (OSError, ValueError) as exc:
        logger.error("%s", exc)
        return 2
    started = _start_engine(args)
    if isinstance(started, int):
        return started
    engine, model_id = started
    defaults = {
        "max_tokens": args.max_tokens,
        "temperature": args.temp,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
    }
    aliases = {model_id, "default_model"} | ({args.model} if args.model else set())
    state = ServerState(
        engine=engine,
        model_id=model_id,
        model_aliases=aliases,
        defaults=defaults,
        api_key=api_key,
        max_request_bytes=args.max_request_bytes,
        allowed_origins=args.allowed_origins,
        request_timeout=args.request_timeout,
        max_connections=args.max_connections,
    )
    try:
        server = make_server(state, args.host, args.port)
    except OSError as exc:
        logger.error("cannot bind %s:%d: %s", args.host, args.port, exc)
        return 1
    engine.start()
    host, port = server.server_address[:2]
    logger.info(
        "serving %s on http://%s:%d (kv path: %s)",
        model_id,
        host,
        port,
        "paged" if engine.config.kv_paged else "contiguous",
    )
    print(f"mlx-paged: serving {model_id} on http://{host}:{port}", flush=True)
    serve_until_signal(server, state, args.shutdown_grace)
    _exit_now(0)
    return 0  # not reached


def _start_engine(args: argparse.Namespace):
    """(engine, model id) for the serve flags, or an exit code after logging why the model
    cannot be served."""
    from mlx_paged.engine.core import Engine
    from mlx_paged.models.loader import load_model

    config = EngineConfig(
        kv_paged=args.kv_paged,
        max_num_seqs=args.decode_concurrency,
        max_num_prefill_seqs=args.prompt_concurrency,
        prefill_step_size=args.prefill_step_size,
        block_size=args.block_size,
        kv_budget_bytes=args.kv_budget,
        num_blocks=args.num_blocks,
        enable_prefix_caching=not args.no_prefix_caching,
        paged_attention=args.paged_attention,
    )
    try:
        model, tokenizer, model_id, model_config = load_model(args.model, args.chat_template)
    except (RuntimeError, ValueError, OSError) as exc:
        logger.error("could not load the model: %s", exc)
        return 1
    try:
        engine = Engine(model, tokenizer, config, model_config)
    except ValueError as exc:  # a model the paged path cannot serve, or a pool too small
        logger.error("%s", exc)
        return 2
    return engine, model_id


def _exit_now(code: int) -> None:
    """Leave without running interpreter teardown: MLX's native threads can abort the process
    ("terminate called without an active exception") while static objects are destroyed,
    turning a clean shutdown into exit code 134. Everything is flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlx-paged", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_args(sub.add_parser("serve", help="serve a model over an OpenAI-compatible API"))

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    from mlx_paged.cli.bench import add_bench_parsers

    add_bench_parsers(bench_sub)

    from mlx_paged.cli.kernels import add_kernels_parser

    add_kernels_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = getattr(args, "log_level", "INFO")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
