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
    # Decode steps that ran no prompt chunk, and their time.
    decode_steps_total: int = 0
    decode_seconds_total: float = 0.0
    # Parts of decode_seconds_total: waiting for the device, building the step's graph, MLX's
    # dispatch of it, delivering its tokens (the runner counts the first three).
    decode_wait_seconds_total: float = 0.0
    decode_build_seconds_total: float = 0.0
    decode_dispatch_seconds_total: float = 0.0
    decode_deliver_seconds_total: float = 0.0
    # Decode steps that also ran prompt chunks (the paged path's mixed steps), and their time.
    mixed_steps_total: int = 0
    mixed_step_seconds_total: float = 0.0
    prefill_seconds_total: float = 0.0
    finished: dict[str, int] = field(default_factory=dict)
    # The runner's cumulative wait, build and dispatch seconds at the last step counted.
    _runner_seen: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def count_finish(self, reason: str) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1

    def count_decode_step(
        self, runner, start: float, delivering: float, end: float, mixed: bool = False
    ) -> None:
        """A decode step that ran from `start` to `end` and delivered its tokens from
        `delivering`; the runner's own counters give the rest of the split. A `mixed` step
        (prompt chunks rode in its forward) counts apart, so the split is decode work alone."""
        seen = (runner.device_wait_seconds, runner.build_seconds, runner.dispatch_seconds)
        wait, build, dispatch = (now - before for now, before in zip(seen, self._runner_seen))
        self._runner_seen = seen
        if mixed:
            self.mixed_steps_total += 1
            self.mixed_step_seconds_total += end - start
            return
        self.decode_steps_total += 1
        self.decode_seconds_total += end - start
        self.decode_deliver_seconds_total += end - delivering
        self.decode_wait_seconds_total += wait
        self.decode_build_seconds_total += build
        self.decode_dispatch_seconds_total += dispatch


class _Exposition:
    """Prometheus text lines, each metric's HELP and TYPE written once, before its first sample."""

    def __init__(self):
        self.lines: list[str] = []
        self._described: set[str] = set()

    def add(self, name: str, kind: str, help_text: str, value, labels: str = "") -> None:
        if name not in self._described:
            self._described.add(name)
            self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        self.lines.append(f"{name}{labels} {value}")


def render_prometheus(engine) -> str:
    """Render the engine's gauges and counters in Prometheus' text exposition format."""
    out = _Exposition()
    _request_metrics(out, engine)
    if engine.kv is not None:
        _kv_metrics(out, engine)
    m = engine.metrics
    out.add("mlx_paged_decode_steps_total", "counter", "Decode steps that ran no prompt chunk.",
            m.decode_steps_total)  # fmt: skip
    out.add("mlx_paged_decode_seconds_total", "counter",
            "Time in decode steps that ran no prompt chunk.",
            round(m.decode_seconds_total, 6))  # fmt: skip
    out.add("mlx_paged_mixed_steps_total", "counter",
            "Decode steps that also ran prompt chunks.", m.mixed_steps_total)  # fmt: skip
    out.add("mlx_paged_mixed_step_seconds_total", "counter",
            "Time in decode steps that also ran prompt chunks.",
            round(m.mixed_step_seconds_total, 6))  # fmt: skip
    for name, help_text, value in (
        ("wait", "Time decode steps waited for the device; the rest of the decode time is host "
         "work.", m.decode_wait_seconds_total),
        ("build", "Time decode steps spent building their graph: inputs, forward, sampling.",
         m.decode_build_seconds_total),
        ("dispatch", "Time in MLX's dispatch of decode steps (mx.async_eval): host work that "
         "launches their kernels.", m.decode_dispatch_seconds_total),
        ("deliver", "Time decode steps spent delivering tokens: stop checks and handing them to "
         "the front.", m.decode_deliver_seconds_total),
    ):  # fmt: skip
        out.add(f"mlx_paged_decode_{name}_seconds_total", "counter", help_text, round(value, 6))
    out.add("mlx_paged_prefill_seconds_total", "counter", "Time in prompt steps.",
            round(m.prefill_seconds_total, 6))  # fmt: skip
    if getattr(engine.runner, "proposer", None) is not None:
        _speculation_metrics(out, engine.runner)
    return "\n".join(out.lines) + "\n"


def _speculation_metrics(out: _Exposition, runner) -> None:
    for name, help_text, value in (
        ("spec_drafts_total", "Verify rows: rows that carried a speculative draft.",
         runner.spec_drafts),
        ("spec_draft_tokens_total", "Tokens drafted.", runner.spec_draft_tokens),
        ("spec_accepted_tokens_total", "Drafted tokens accepted.", runner.spec_accepted_tokens),
    ):  # fmt: skip
        out.add(f"mlx_paged_{name}", "counter", help_text, value)


def _request_metrics(out: _Exposition, engine) -> None:
    m, sched = engine.metrics, engine.scheduler
    out.add("mlx_paged_requests_running", "gauge", "Requests decoding or prefilling.",
            len(sched.running) + len(sched.prefilling))  # fmt: skip
    out.add("mlx_paged_requests_waiting", "gauge", "Requests queued for admission.",
            len(sched.waiting))  # fmt: skip
    out.add("mlx_paged_requests_total", "counter", "Requests received.", m.requests_total)
    # A copy (one atomic step under the GIL): the engine thread may add a reason meanwhile, and
    # iterating the live dict would then raise and drop the scrape's connection.
    for reason, count in sorted(dict(m.finished).items()):
        out.add("mlx_paged_requests_finished_total", "counter", "Finished requests by reason.",
                count, f'{{reason="{reason}"}}')  # fmt: skip
    for name, help_text, value in (
        ("prompt_tokens_total", "Prompt tokens computed.", m.prompt_tokens_total),
        ("generation_tokens_total", "Tokens generated.", m.generation_tokens_total),
        ("preemptions_total", "Requests preempted for KV space.", m.preemptions_total),
        ("prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.",
         m.prefix_cache_hit_tokens_total),
    ):  # fmt: skip
        out.add(f"mlx_paged_{name}", "counter", help_text, value)
    out.add("mlx_paged_kv_cache_bytes", "gauge",
            "KV bytes in blocks and recurrent-state slots that running requests hold (0 when "
            "idle; cached free blocks and state snapshots are not counted).",
            engine.runner.kv_bytes_in_use)  # fmt: skip


def _kv_metrics(out: _Exposition, engine) -> None:
    pool = engine.kv.block_pool
    cached = pool.num_cached_free_blocks
    for name, help_text, value in (
        ("kv_blocks_total", "Usable KV blocks: the pool's blocks less block 0, the null "
         "block that pads block tables.", pool.num_usable_blocks),
        ("kv_pool_bytes", "Bytes of the whole KV page pool, allocated at start.",
         engine.runner.pool.nbytes),
        ("kv_blocks_free", "Free KV blocks that hold no cached prefix.",
         pool.num_free_blocks - cached),
        ("kv_blocks_cached", "Free KV blocks that still hold a cached prefix (evictable).",
         cached),
        ("kv_block_size", "Tokens per KV block.", engine.kv.block_size),
        ("kv_bytes_per_token", "KV bytes per token of a block: K and V of every layer of "
         "one KV cache group (every layer, unless sliding windows have groups).",
         engine.runner.pool.nbytes // (engine.runner.pool.num_blocks * engine.kv.block_size)),
    ):  # fmt: skip
        out.add(f"mlx_paged_{name}", "gauge", help_text, value)
    if getattr(engine.runner, "states", None) is not None:
        _state_metrics(out, engine.runner.states)
    calls = engine.runner.pool.attention_calls
    paths = ["kernel", "reference", "causal", "causal_rows"]  # shown always; others once run
    paths += sorted({path for path, _ in calls} - set(paths))
    for path in paths:
        for phase in ("decode", "prefill"):
            out.add("mlx_paged_attention_calls_total", "counter",
                    "Paged attention calls (one per layer per forward) by path and phase; "
                    "gated_delta_kernel: recurrences on the generated kernel; "
                    "gated_delta_step_kernel: Qwen3.5 decode steps in one kernel.",
                    calls[path, phase], f'{{path="{path}",phase="{phase}"}}')  # fmt: skip


def _state_metrics(out: _Exposition, states) -> None:
    """A hybrid model's recurrent-state slots (`HybridStates`)."""
    slots = states.slots
    for name, help_text, value in (
        ("state_slots_total", "Recurrent-state slots for live requests and snapshots.",
         slots.num_slots - 1),
        ("state_slots_running", "State slots held by running or prefilling requests.",
         len(slots.req_to_slot)),
        ("state_snapshots", "State slots holding a prefix-cache snapshot (evictable).",
         len(slots.snapshots)),
        ("state_pool_bytes", "Bytes the KV budget reserves for recurrent-state slots.",
         states.pool.nbytes),
    ):  # fmt: skip
        out.add(f"mlx_paged_{name}", "gauge", help_text, value)
