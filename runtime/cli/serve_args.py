"""The flags of `mlx-paged serve`: `mlx_lm.server`'s, the paged KV's, and the HTTP bounds."""

from __future__ import annotations

import argparse
import re

from mlx_paged.cli.arg_types import non_negative_float, positive, positive_float
from mlx_paged.cli.speculation_args import add_speculation_args
from mlx_paged.cli.step_args import add_step_args
from mlx_paged.kernels.quantized_pages import KV_BITS, KV_GROUP_SIZES

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


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """Add every `serve` flag to `p`."""
    _add_model_args(p)
    _add_kv_args(p)
    _add_attention_args(p)
    _add_quantization_args(p)
    add_speculation_args(p)
    add_step_args(p)
    _add_http_args(p)


def _add_model_args(p: argparse.ArgumentParser) -> None:
    """The flags `mlx_lm.server` has too."""
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
        type=positive,
        default=512,
        help="default max tokens per response (default 512)",
    )
    p.add_argument("--temp", type=float, default=0.0, help="default temperature (default 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="default top-p (default 1)")
    p.add_argument("--top-k", type=int, default=0, help="default top-k, 0 = off")
    p.add_argument("--min-p", type=float, default=0.0, help="default min-p, 0 = off")
    p.add_argument(
        "--decode-concurrency",
        type=positive,
        default=32,
        help="most requests decoding at once (default 32)",
    )
    p.add_argument(
        "--prompt-concurrency",
        type=positive,
        default=8,
        help="most requests prefilling at once (default 8)",
    )
    p.add_argument(
        "--prefill-step-size",
        type=positive,
        default=2048,
        help="prompt tokens per request per step (default 2048)",
    )
    p.add_argument(
        "--chat-template",
        default=None,
        help="a Jinja chat template (text) that replaces the model's",
    )
    p.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="what the log shows: INFO has the start-up steps, one line per request and "
        "progress of long work; DEBUG adds refused connections",
    )


def _add_kv_args(p: argparse.ArgumentParser) -> None:
    """The paged KV cache and its attention."""
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
        type=positive,
        default=None,
        help="KV pool size in blocks (wins over --kv-budget)",
    )


def _add_attention_args(p: argparse.ArgumentParser) -> None:
    """How paged attention runs: kernels, compiled steps, fused RoPE."""
    p.add_argument(
        "--paged-attention",
        choices=["auto", "kernel", "reference"],
        default="auto",
        help="decode attention over pages: the generated Metal/CUDA kernel on a GPU "
        "(auto, the default; 'kernel' fails without one) or gather + SDPA "
        "('reference', also the CPU path)",
    )
    p.add_argument(
        "--compile-decode",
        choices=["auto", "on", "off"],
        default="auto",
        help="replay decode steps from mx.compile traces (auto, the default: with the GPU kernels)",
    )
    p.add_argument(
        "--fused-rope",
        choices=["auto", "on", "off"],
        default="off",
        help="apply RoPE inside the decode attention kernel (decode_rope_*): auto uses it with "
        "the GPU kernels for models whose RoPE it expresses; off (the default) measured no "
        "faster on the H200",
    )
    p.add_argument(
        "--lean-decode",
        choices=["auto", "on", "fused", "off"],
        default="auto",
        help="decode steps of llama, mistral and qwen2/3 models in fewer graph nodes than "
        "mlx-lm's forward (on); fused: fewer again, each layer's small ops in the generated "
        "layer kernels, refused where the blocks do not allow it; auto (the default): fused "
        "where the blocks allow it, else on; off: mlx-lm's own "
        "forward",
    )


def _add_quantization_args(p: argparse.ArgumentParser) -> None:
    """Quantized pages."""
    p.add_argument(
        "--kv-bits",
        type=int,
        choices=list(KV_BITS),
        default=16,
        help="bits per K and V value in the paged pool: 16 (the model's dtype, the default), "
        "8 or 4 (quantized pages in MLX's affine layout: about 1.9x / 3.6x the tokens)",
    )
    for side in ("k", "v"):
        p.add_argument(
            f"--kv-bits-{side}",
            type=int,
            choices=list(KV_BITS),
            default=None,
            help=f"bits per {side.upper()} value, over --kv-bits (keys are the more sensitive)",
        )
    p.add_argument(
        "--kv-group-size",
        type=int,
        choices=list(KV_GROUP_SIZES),
        default=64,
        help="values per scale and bias in quantized pages (default 64)",
    )


def _add_http_args(p: argparse.ArgumentParser) -> None:
    """Authentication, bounds on what one client can hold, CORS, shutdown."""
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
        "--max-pending-bytes",
        type=parse_size,
        default=64 * 1024 * 1024,
        help="most request-body bytes all connections hold together while they are read and "
        "parsed; past it a request gets 503 (default 64MiB; at least --max-request-bytes)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=30.0,
        help="seconds a client has to send a whole request, headers and body, and "
        "that an idle keep-alive connection stays open (default 30)",
    )
    p.add_argument(
        "--max-connections",
        type=positive,
        default=512,
        help="most open client connections; at the cap a new one replaces the "
        "longest idle one, or gets 503 when all are busy (default 512)",
    )
    p.add_argument("--allowed-origins", default="*", help="CORS allowed origins (default *)")
    p.add_argument(
        "--shutdown-grace",
        type=non_negative_float,
        default=10.0,
        help="seconds in-flight requests get to finish on Ctrl-C/SIGTERM (default 10)",
    )
