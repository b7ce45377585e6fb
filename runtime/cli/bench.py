"""`mlx-paged bench ...` subcommands; the benchmarks themselves live in `mlx_paged.bench`."""

from __future__ import annotations

import argparse
import importlib

from mlx_paged.bench.decode import DEFAULT_METHODS, ENGINE_METHODS
from mlx_paged.cli.bench_kernels import add_kernels_bench
from mlx_paged.cli.bench_trace import add_trace_bench
from mlx_paged.kernels.quantized_pages import KV_BITS, KV_GROUP_SIZES


def _bench(module: str):
    """Run `mlx_paged.bench.<module>.main`, imported only when that benchmark is asked for."""

    def run(args) -> int:
        return importlib.import_module(f"mlx_paged.bench.{module}").main(args)

    return run


def add_bench_parsers(sub: argparse._SubParsersAction) -> None:
    """Add one subcommand per public benchmark to `sub`."""
    _add_throughput(sub)
    _add_memory(sub)
    _add_prefix_cache(sub)
    add_kernels_bench(sub, _bench("kernels"))
    _add_decode(sub)
    _add_serve(sub)
    _add_structured(sub)
    _add_speculative(sub)
    _add_prefill(sub)
    _add_kv_quality(sub)
    _add_ops(sub)
    add_trace_bench(sub, _bench("device_trace"))


def _add_random_llama_model(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help="model (default: a random ~1B llama built on the fly)"
    )


def _add_throughput(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("throughput", help="engine tokens/s vs mlx-lm's BatchGenerator")
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2)")
    p.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 8], help="prompts run at once, per row"
    )
    p.add_argument("--max-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per path (median kept)")
    p.add_argument("--out", default="bench/out/throughput.json", help="JSON results file")
    p.set_defaults(run=_bench("throughput"))


def _add_memory(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("memory", help="KV memory density: paged vs contiguous vs BatchGenerator")
    p.add_argument(
        "--budget-tokens",
        type=int,
        default=8192,
        help="KV budget, in tokens of the benchmark model (default 8192)",
    )
    # enough requests that every page width keeps some waiting, so the budget binds
    p.add_argument("--requests", type=int, default=192, help="requests in the workload")
    p.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    p.add_argument(
        "--cap",
        type=int,
        default=16,
        help="decode batch cap for the paths without a KV budget (default 16)",
    )
    p.add_argument(
        "--kv-bits",
        type=int,
        nargs="+",
        choices=list(KV_BITS),
        default=[16],
        help="bits per K/V value of the paged runs, e.g. 16 8 4 (default 16)",
    )
    p.add_argument(
        "--family",
        choices=("llama", "qwen3_5", "gemma3", "gemma4", "deepseek_v3"),
        default="llama",
        help="the random model: a llama, a Qwen3.5-like hybrid (recurrent state per sequence), "
        "a Gemma-3-like model (sliding windows), a Gemma-4-like one (sliding windows, its "
        "full-attention layer of another K/V shape) or a DeepSeek-V3-like one (latent "
        "attention: a latent and a RoPE key row a token)",
    )
    p.add_argument("--out", default="bench/out/memory.json", help="JSON results file")
    p.set_defaults(run=_bench("memory"))


def _add_prefix_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prefix-cache", help="TTFT with a repeated system prompt, cold vs warm")
    p.add_argument("--model", default=None, help="model (default: embedded SmolLM2)")
    p.add_argument(
        "--system-tokens", type=int, default=300, help="tokens of the shared system prompt"
    )
    p.add_argument("--repeats", type=int, default=5, help="cold/warm pairs timed (median kept)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--out", default="bench/out/prefix-cache.json", help="JSON results file")
    p.set_defaults(run=_bench("prefix_cache"))


def _add_decode(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "decode",
        help="end-to-end decode tok/s at a large batch: paged + kernel, "
        "paged + reference, contiguous, BatchGenerator",
    )
    _add_random_llama_model(p)
    p.add_argument(
        "--random-model",
        choices=("llama-1b", "qwen3_5-1b"),
        default="llama-1b",
        help="the random model built when no --model is given",
    )
    p.add_argument("--batch", type=int, default=64, help="sequences decoding together")
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--new", type=int, default=128, help="new tokens per sequence")
    p.add_argument("--prefill-batch", type=int, default=8, help="sequences prefilling at once")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds (median kept)")
    p.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        choices=list(ENGINE_METHODS),
        help="engine paths to time next to BatchGenerator (default: %(default)s)",
    )
    p.add_argument("--out", default="bench/out/decode.json", help="JSON results file")
    p.set_defaults(run=_bench("decode"))


def _add_serve(sub: argparse._SubParsersAction) -> None:
    from mlx_paged.bench.serve_servers import DEFAULT_PEER

    p = sub.add_parser(
        "serve",
        help="our server against a peer (default mlx_lm.server) over HTTP, one run: "
        "output tok/s, TTFT, ITL, latency, errors; plus our offline throughput",
    )
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2)")
    p.add_argument(
        "--random-llama", action="store_true", help="a random ~1B llama built on the fly"
    )
    p.add_argument("--prompt-tokens", type=int, default=512, help="tokens per prompt (about)")
    p.add_argument("--max-tokens", type=int, default=128, help="most output tokens per request")
    p.add_argument(
        "--concurrency",
        type=int,
        nargs="*",
        default=[1, 16, 64],
        help="closed-loop levels: requests in flight",
    )
    p.add_argument(
        "--rate", type=float, nargs="*", default=[], help="Poisson request rates (req/s)"
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=16,
        help="requests per level: this, or twice the concurrency (default 16)",
    )
    p.add_argument(
        "--peer",
        default=DEFAULT_PEER,
        help="the peer's command; {python}, {model}, {port}, {concurrency} are filled in; "
        "'none' runs ours alone (default: %(default)s)",
    )
    p.add_argument("--peer-name", default="mlx_lm.server", help="the peer's name in the table")
    p.add_argument("--ours-args", default="", help="extra `mlx-paged serve` flags, one string")
    p.add_argument(
        "--warm-up",
        type=int,
        default=4,
        help="fewest warm-up requests before each level (default 4; else its concurrency)",
    )
    _add_serve_extras(p)
    _add_server_run(p)
    p.add_argument("--out", default="bench/out/serve.json", help="JSON results file (+ .png)")
    p.set_defaults(run=_bench("serve"))


def _add_structured(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "structured",
        help="our server's output tok/s with a JSON schema on every request against none",
    )
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2)")
    p.add_argument(
        "--random-llama", action="store_true", help="a random ~1B llama built on the fly"
    )
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--requests", type=int, default=64, help="requests per arm and round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of both arms (median)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="tokens per prompt (about)")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--ours-args", default="", help="extra `mlx-paged serve` flags, one string")
    _add_server_run(p)
    p.add_argument("--out", default="bench/out/structured.json", help="JSON results file")
    p.set_defaults(run=_bench("structured"))


def _add_speculative(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "speculative",
        help="decode tok/s with prompt lookup drafts against plain decoding, copy-heavy and "
        "free-form workloads",
    )
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2)")
    p.add_argument("--concurrency", type=int, nargs="*", default=[1, 16], help="requests at once")
    p.add_argument("--max-tokens", type=int, default=256, help="output tokens per request")
    p.add_argument("--num-draft-tokens", type=int, default=4, help="most tokens a draft holds")
    p.add_argument(
        "--draft-model", default=None, help="also measure drafts from this model (a folder)"
    )
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per engine (median)")
    p.add_argument("--out", default="bench/out/speculative.json", help="JSON results file")
    p.set_defaults(run=_bench("speculative"))


def _add_server_run(p: argparse.ArgumentParser) -> None:
    """Timeouts, logs and the seed of a benchmark that starts servers."""
    p.add_argument("--timeout", type=float, default=600, help="seconds per request")
    p.add_argument("--start-timeout", type=float, default=600, help="seconds to start a server")
    p.add_argument("--logs", default=None, help="folder for the servers' logs (default: temp)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts (and arrivals)")


def _add_serve_extras(p: argparse.ArgumentParser) -> None:
    """`bench serve`'s extra measures: offline throughput, a long prompt among streams."""
    p.add_argument("--no-offline", action="store_true", help="skip the offline throughput")
    p.add_argument(
        "--long-prompt",
        type=int,
        default=0,
        help="also send one prompt of this many tokens among decoding streams and report their "
        "ITL during its prefill (0: off)",
    )
    p.add_argument("--long-prompt-streams", type=int, default=32, help="streams decoding then")
    p.add_argument(
        "--long-prompt-stream-tokens", type=int, default=512, help="output tokens per stream"
    )


def _add_prefill(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prefill", help="prefill tok/s of uncached prompts: paged engine vs BatchGenerator"
    )
    _add_random_llama_model(p)
    p.add_argument("--batch", type=int, default=64, help="prompts")
    p.add_argument("--prompt", type=int, default=512, help="tokens per prompt")
    p.add_argument(
        "--prefill-batch", type=int, nargs="+", default=[8], help="prompts prefilling at once"
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs (median kept)")
    p.add_argument("--out", default="bench/out/prefill.json", help="JSON results file")
    p.set_defaults(run=_bench("prefill"))


def _add_kv_quality(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kv-quality",
        help="quality of quantized K/V pages: perplexity, KL and greedy agreement vs 16-bit",
    )
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2)")
    p.add_argument("--tokens", type=int, default=1024, help="tokens of held-out text scored")
    p.add_argument("--chunk", type=int, default=128, help="tokens per forward (>= 2)")
    p.add_argument(
        "--group-size",
        type=int,
        choices=list(KV_GROUP_SIZES),
        default=64,
        help="values per scale and bias of quantized pages",
    )
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens of the greedy runs")
    p.add_argument("--new", type=int, default=64, help="greedy tokens generated per setting")
    p.add_argument("--out", default="bench/out/kv-quality.json", help="JSON results file")
    p.set_defaults(run=_bench("kv_quality"))


def _add_ops(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", help="MLX primitives of one decode step, a layer, vs mlx-lm's")
    p.add_argument("--family", nargs="+", choices=("llama", "qwen3", "deepseek_v3"),
                   default=["llama", "qwen3", "deepseek_v3"],
                   help="random models to count (default: all three; deepseek_v3 has latent "
                   "attention)")  # fmt: skip
    p.add_argument("--out", default="bench/out/ops.json", help="JSON results file")
    p.set_defaults(run=_bench("ops"))
