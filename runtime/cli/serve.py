"""`mlx-paged serve`: start the engine process, serve HTTP until a signal."""

from __future__ import annotations

import argparse
import logging
import os

from mlx_paged.cli.serve_args import API_KEY_ENV
from mlx_paged.engine.config import EngineConfig
from mlx_paged.process import exit_now, freeze_startup_objects

logger = logging.getLogger("mlx_paged")


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
    """Start the engine process (it loads the model) and serve HTTP until a signal arrives."""
    from mlx_paged.server.lifecycle import serve_until_signal
    from mlx_paged.server.listener import make_server
    from mlx_paged.server.open_files import raise_open_file_limit
    from mlx_paged.server.state import ServerState

    try:
        api_key = resolve_api_key(args)
    except (OSError, ValueError) as exc:
        logger.error("%s", exc)
        return 2
    if args.max_pending_bytes < args.max_request_bytes:
        logger.error("--max-pending-bytes must be at least --max-request-bytes")
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
    aliases = {model_id, "default", "default_model"} | ({args.model} if args.model else set())
    state = ServerState(
        engine=engine,
        model_id=model_id,
        model_aliases=aliases,
        defaults=defaults,
        api_key=api_key,
        max_request_bytes=args.max_request_bytes,
        max_pending_bytes=args.max_pending_bytes,
        allowed_origins=args.allowed_origins,
        request_timeout=args.request_timeout,
        max_connections=args.max_connections,
    )
    raise_open_file_limit(args.max_connections)
    try:
        server = make_server(state, args.host, args.port)
    except OSError as exc:
        logger.error("cannot bind %s:%d: %s", args.host, args.port, exc)
        engine.shutdown(timeout=5)
        return 1
    _announce(model_id, *server.server_address[:2], engine.config.kv_paged)
    freeze_startup_objects()
    serve_until_signal(server, state, args.shutdown_grace)
    exit_now(0)
    return 0  # not reached


def _announce(model_id: str, host: str, port: int, kv_paged: bool) -> None:
    """One line saying where the server listens and which model id clients send; printed
    when the log level hides it, so it is always seen once."""
    line = (
        f"serving {model_id!r} on http://{host}:{port}/v1 (kv path: "
        f"{'paged' if kv_paged else 'contiguous'}); clients send model={model_id!r} or 'default'"
    )
    if logger.isEnabledFor(logging.INFO):
        logger.info("%s", line)
    else:
        print(f"mlx-paged: {line}", flush=True)


def engine_config(args: argparse.Namespace) -> EngineConfig:
    """The engine configuration the serve flags ask for."""
    return EngineConfig(
        kv_paged=args.kv_paged,
        max_num_seqs=args.decode_concurrency,
        max_num_prefill_seqs=args.prompt_concurrency,
        prefill_step_size=args.prefill_step_size,
        max_num_batched_tokens=args.max_num_batched_tokens,
        block_size=args.block_size,
        kv_budget_bytes=args.kv_budget,
        num_blocks=args.num_blocks,
        enable_prefix_caching=not args.no_prefix_caching,
        paged_attention=args.paged_attention,
        compile_decode=args.compile_decode,
        fused_rope=args.fused_rope,
        lean_decode=args.lean_decode,
        kv_bits=args.kv_bits,
        kv_bits_k=args.kv_bits_k,
        kv_bits_v=args.kv_bits_v,
        kv_group_size=args.kv_group_size,
        prefill_chunk_seconds=args.prefill_chunk_seconds or None,
        prefill_itl_ratio=args.prefill_itl_ratio or None,
        draft_model=args.draft_model,
        num_draft_tokens=args.num_draft_tokens,
        step_log=args.step_log,
    )


def _start_engine(args: argparse.Namespace):
    """(engine client, model id) for the serve flags, or an exit code after logging why the
    model cannot be served. The tokenizer loads here; the weights in the engine process."""
    from mlx_paged.engine.core_client import EngineClient, EngineStartError
    from mlx_paged.engine.core_process import EngineProcessSpec
    from mlx_paged.models.loader import load_front

    config = engine_config(args)
    try:
        tokenizer, model_id, _, path = load_front(args.model, args.chat_template)
    except (RuntimeError, ValueError, OSError) as exc:
        logger.error("could not load the model: %s", exc)
        return 1
    spec = EngineProcessSpec(path, args.chat_template, config, args.log_level)
    engine = EngineClient(spec, tokenizer)
    try:
        engine.start()
    except EngineStartError as exc:
        logger.error("%s", exc)
        return exc.exit_code
    return engine, model_id
