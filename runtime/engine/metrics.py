"""Engine counters and their Prometheus text rendering for `GET /metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EngineMetrics:
    """Monotonic counters; the engine thread writes them, `/metrics` reads them (ints and floats
    are replaced atomically, so a reader sees a recent value without locking)."""

    requests_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    preemptions_total: int = 0
    prefix_cache_hit_tokens_total: int = 0
    decode_seconds_total: float = 0.0
    prefill_seconds_total: float = 0.0
    finished: dict[str, int] = field(default_factory=dict)

    def count_finish(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1


def render_prometheus(engine) -> str:
    """Render the engine's gauges and counters in Prometheus' text exposition format."""
    m = engine.metrics
    sched = engine.scheduler
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, value, labels: str = "") -> None:
        if not any(line.startswith(f"# TYPE {name} ") for line in lines):
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{labels} {value}")

    metric(
        "mlx_paged_requests_running",
        "gauge",
        "Requests decoding or prefilling.",
        len(sched.running) + len(sched.prefilling),
    )
    metric(
        "mlx_paged_requests_waiting", "gauge", "Requests queued for admission.", len(sched.waiting)
    )
    metric("mlx_paged_requests_total", "counter", "Requests received.", m.requests_total)
    # A copy (one atomic step under the GIL): the engine thread may add a reason meanwhile, and
    # iterating the live dict would then raise and drop the scrape's connection.
    for reason, count in sorted(dict(m.finished).items()):
        metric(
            "mlx_paged_requests_finished_total",
            "counter",
            "Finished requests by reason.",
            count,
            f'{{reason="{reason}"}}',
        )
    metric(
        "mlx_paged_prompt_tokens_total", "counter", "Prompt tokens computed.", m.prompt_tokens_total
    )
    metric(
        "mlx_paged_generation_tokens_total",
        "counter",
        "Tokens generated.",
        m.generation_tokens_total,
    )
    metric(
        "mlx_paged_preemptions_total",
        "counter",
        "Requests preempted for KV space.",
        m.preemptions_total,
    )
    metric(
        "mlx_paged_prefix_cache_hit_tokens_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        m.prefix_cache_hit_tokens_total,
    )
    metric(
        "mlx_paged_kv_cache_bytes",
        "gauge",
        "KV cache bytes held by running requests.",
        engine.runner.kv_bytes_in_use,
    )
    if engine.kv is not None:
        pool = engine.kv.block_pool
        cached = pool.num_cached_free_blocks
        metric(
            "mlx_paged_kv_blocks_total",
            "gauge",
            "Usable KV blocks in the pool.",
            pool.num_usable_blocks,
        )
        metric(
            "mlx_paged_kv_blocks_free",
            "gauge",
            "Free KV blocks that hold no cached prefix.",
            pool.num_free_blocks - cached,
        )
        metric(
            "mlx_paged_kv_blocks_cached",
            "gauge",
            "Free KV blocks that still hold a cached prefix (evictable).",
            cached,
        )
        metric("mlx_paged_kv_block_size", "gauge", "Tokens per KV block.", engine.kv.block_size)
        calls = engine.runner.pool.attention_calls
        for path in ("kernel", "reference"):
            for phase in ("decode", "prefill"):
                metric(
                    "mlx_paged_attention_calls_total",
                    "counter",
                    "Paged attention calls (one per layer per forward) by path and phase.",
                    calls[path, phase],
                    f'{{path="{path}",phase="{phase}"}}',
                )
    metric(
        "mlx_paged_decode_seconds_total",
        "counter",
        "Time in decode steps.",
        round(m.decode_seconds_total, 6),
    )
    metric(
        "mlx_paged_prefill_seconds_total",
        "counter",
        "Time in prompt steps.",
        round(m.prefill_seconds_total, 6),
    )
    return "\n".join(lines) + "\n"
