"""The engine core: one thread that owns every MLX object and runs the step loop.

Other threads talk to it through `submit` / `abort`, which only enqueue; the engine thread
applies them between steps, so the scheduler and caches are never touched concurrently. Each
step's token ids go to a sink as one list of `CoreOutput`s: in this process, an `OutputRouter`
that detokenizes into request streams; in the engine process, the pipe to the front.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import generation_stream

from mlx_paged.engine.config import EngineConfig
from mlx_paged.engine.fault_isolation import SamplingCheck
from mlx_paged.engine.inbox import EngineInbox
from mlx_paged.engine.metrics import EngineMetrics
from mlx_paged.engine.output_router import OutputRouter
from mlx_paged.engine.outputs import CoreOutput
from mlx_paged.engine.request_checks import RequestLimits, context_length
from mlx_paged.engine.request_stream import RequestStream
from mlx_paged.engine.runner_setup import build_runner, scheduling_limits
from mlx_paged.engine.scheduler import Scheduler
from mlx_paged.engine.step_log import StepLog
from mlx_paged.engine.step_pacer import StepPacer
from mlx_paged.engine.step_recovery import StepRecovery
from mlx_paged.engine.stop_checker import StopChecker
from mlx_paged.request import PromptSchedule, Request, RequestStatus
from mlx_paged.sampling.sampler import make_row_sampling
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.speculative.setup import draft_prefill_shapes
from mlx_paged.structured.matchers import GrammarMatchers

logger = logging.getLogger(__name__)


class Engine(EngineInbox, StepRecovery):
    """Continuous-batching engine over one model.

    Args:
        model: an mlx-lm model.
        tokenizer: its mlx-lm `TokenizerWrapper`.
        config: engine knobs.
        model_config: the model's config.json contents (for the context length).
        sink: receives each step's `CoreOutput`s on the engine thread; None routes them to
            the streams `add_request` returns, detokenized in this process.
    """

    def __init__(
        self,
        model,
        tokenizer,
        config: EngineConfig,
        model_config: dict | None = None,
        sink: Callable[[list[CoreOutput]], None] | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.max_model_len = config.max_model_len or context_length(model_config or {}) or 131072
        model_type = (model_config or {}).get("model_type", "")
        self.runner, self.kv = build_runner(
            model, model_type, config, self.max_model_len, tokenizer
        )
        serial = not getattr(self.runner, "batches_exactly", True)  # see ContiguousRunner
        self.scheduler = Scheduler(
            max_num_seqs=1 if serial else config.max_num_seqs,
            max_num_prefill_seqs=1 if serial else config.max_num_prefill_seqs,
            prefill_step_size=config.prefill_step_size,
            max_num_batched_tokens=config.max_num_batched_tokens,
            kv=self.kv,
            **scheduling_limits(self.runner, self.kv),
        )
        seconds = config.prefill_chunk_seconds if self.kv is not None else None
        self.pacer = StepPacer(seconds, config.step_token_ceiling, config.prefill_itl_ratio)
        self._set_step_budgets()
        # The paged runner runs a step's prefill chunks inside its decode forward.
        self._mixes = getattr(self.runner, "mixes_prefill", False)
        self.stop_checker = StopChecker(tokenizer.eos_token_ids)
        self.router = OutputRouter(tokenizer, self.abort) if sink is None else None
        self._sink = sink or self.router.route
        self.metrics = EngineMetrics()
        self.step_log = StepLog(config.step_log)
        self._xtc_special = tuple(tokenizer.encode("\n")) + tuple(sorted(tokenizer.eos_token_ids))
        logits = model(mx.array([[0]]))  # no cache: only the logits' width and dtype matter
        # Token ids index both the tokenizer and the logits: the smaller bounds them.
        self.limits = RequestLimits(
            vocab_size=min(len(tokenizer), logits.shape[-1]),
            max_model_len=self.max_model_len,
            pool_tokens=None if self.kv is None else self.kv.max_request_tokens,
            pool_flag="--num-blocks" if config.num_blocks else "--kv-budget",
        )
        self._check_sampling = SamplingCheck(logits.shape[-1], logits.dtype, self._xtc_special)
        self.runner.grammars = GrammarMatchers(tokenizer._tokenizer, logits.shape[-1])
        self.failed_steps_in_a_row = 0
        self.last_step_error: str | None = None
        self._requests: dict[str, Request] = {}  # submitted and not finished, by id
        self._inbox: queue.Queue[tuple] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._running = False
        self._stopping = threading.Event()
        self._stream = generation_stream  # callers that drive `step` themselves use mlx-lm's
        self.error: BaseException | None = None

    # ---- called from any thread -------------------------------------------------------------

    def check_request(
        self, prompt_token_ids: list[int], params: SamplingParams, max_tokens_explicit: bool = True
    ) -> SamplingParams:
        """Validate a request against the model; may shorten a default `max_tokens` to fit.

        Raises:
            InvalidRequestError: see `RequestLimits.fit`.
        """
        return self.limits.fit(prompt_token_ids, params, max_tokens_explicit)

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Queue a request; the returned stream yields its output increments (text included)."""
        if self.router is None:
            raise RuntimeError("this engine sends its outputs to a sink: use submit()")
        request = Request(list(prompt_token_ids), params)
        if request_id is not None:
            request.request_id = request_id
        stream = self.router.open(request.request_id, params, request)
        self.submit(request)
        return stream

    def start(self) -> None:
        """Run the step loop on a background thread."""
        self._running = True  # healthy from now, not from when the thread first runs
        self._thread = threading.Thread(target=self.run_loop, name="mlx-paged-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Cancel what is in flight and stop the thread."""
        self._stopping.set()
        self._inbox.put(("wake",))
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._running and self.error is None

    def fail_open_streams(self, message: str) -> None:
        """End every open stream with an error, from any thread, without waiting for the engine
        thread (it may be inside a long step)."""
        if self.router is not None:
            self.router.fail_all(message)

    # ---- engine thread ----------------------------------------------------------------------

    def run_loop(self) -> None:
        """The step loop, on the calling thread, until `shutdown` (what `start` runs)."""
        self._running = True
        # A stream of the engine thread's own: MLX's thread-local streams abort the process
        # at exit when their thread has ended first.
        self._stream = mx.new_stream(mx.default_device())
        try:
            while not self._stopping.is_set():
                self._drain_inbox(block=not self.scheduler.has_unfinished_requests())
                if self.scheduler.has_unfinished_requests() and not self._stopping.is_set():
                    self.step()
            self._abort_all("the server is shutting down")
        except BaseException as exc:  # the thread must never die silently
            logger.exception("engine thread died")
            self.error = exc
            self._abort_all(f"engine failure: {exc}")
        finally:
            self._running = False
            mx.synchronize(self._stream)

    def warm_up(self) -> None:
        """Meet every prefill attention shape before serving, on the calling thread: where the
        pool buckets them (CUDA), once per thread that steps (`PrefillShapes.warm_up`); the
        draft model's pool's too."""
        if self.kv is None:
            return
        longest = min(self.max_model_len, self.limits.pool_tokens)
        shapes = self.runner.pool.prefill_shapes
        if shapes is not None:  # returns at once on a thread already warmed
            shapes.warm_up(self.config.max_num_prefill_seqs, self.config.prefill_step_size, longest)
        draft = draft_prefill_shapes(self.runner)  # a draft model feeds every decode row
        if draft is not None:
            draft.warm_up(self.config.max_num_seqs, self.config.prefill_step_size, longest)

    def step(self) -> None:
        """One continuous-batching step: decode the running rows, then the prompt work."""
        self.warm_up()
        mark = self.pacer.mark(self.metrics)
        logged = self.step_log.mark(self)
        try:
            with mx.stream(self._stream):
                self._step()
        except Exception as exc:
            self._recover(exc)
        else:
            self.failed_steps_in_a_row = 0
            self.pacer.after_step(self.metrics, mark)
            self._set_step_budgets()
        self.step_log.record(self, logged, failed=self.failed_steps_in_a_row > 0)

    def _set_step_budgets(self) -> None:
        self.scheduler.step_token_budget = self.pacer.budget
        self.scheduler.decoding_prompt_budget = self.pacer.decoding_budget

    def _step(self) -> None:
        # Rows down to their last prompt token decode with the batch (paged path).
        started = self.scheduler.schedule_starting() if self.scheduler.start_in_decode else []
        rows, preempted = self.scheduler.schedule_decode()
        if preempted:
            self.runner.remove(preempted)
            self.metrics.preemptions_total += len(preempted)
        if started:  # a row preempted right away is not starting after all
            decoding = {id(r) for r in rows}
            started = [r for r in started if id(r) in decoding]
            self.metrics.prompt_tokens_total += len(started)
        mixed = self.scheduler.schedule_prompts(len(rows)) if rows and self._mixes else None
        if mixed is not None:
            self._run_prompts(PromptSchedule(joining=mixed.joining))
        if rows:
            tic = time.perf_counter()
            chunks = mixed.prefill if mixed is not None else []
            outputs = self.runner.decode(rows, chunks) if chunks else self.runner.decode(rows)
            delivering = time.perf_counter()
            self._deliver(outputs)
            self.metrics.count_decode_step(
                self.runner, tic, delivering, time.perf_counter(), mixed=bool(chunks)
            )
            self.metrics.prompt_tokens_total += sum(n for _, n in chunks)
        plan = self.scheduler.schedule_prompts(len(rows)) if mixed is None else PromptSchedule()
        self._run_prompts(plan)
        if (plan.starting and not rows) or (started and len(started) == len(rows)):
            # Nothing else decodes, so no overlap is lost: first tokens go out now.
            self._deliver(self.runner.emit_pending())

    def _run_prompts(self, plan: PromptSchedule) -> None:
        for req in plan.joining:
            self._admit(req)
        if not plan.is_empty:
            tic = time.perf_counter()
            self.runner.run_prompts(plan)
            self.metrics.prompt_tokens_total += sum(n for _, n in plan.prefill) + len(plan.starting)
            self.metrics.prefill_seconds_total += time.perf_counter() - tic

    def _deliver(self, rows) -> None:
        """Send each row's token to the sink in one batch; retire the finished requests. Tokens
        after a request's end (accepted drafts past it) are not outputs."""
        outputs, finished, failed, ended = [], [], [], set()
        for row in rows:
            if id(row.request) in ended:
                continue
            try:
                out = self.stop_checker.process(row.request, row.token, row.logprobs)
            except Exception as exc:  # this row's logprobs: it fails alone
                logger.exception("output processing failed for %s", row.request.request_id)
                failed.append((row.request, f"output processing failed: {exc}"))
                ended.add(id(row.request))
                continue
            outputs.append(out)
            if out.finish_reason is not None:
                finished.append(row.request)
                ended.add(id(row.request))
                self.metrics.count_finish(out.finish_reason)
        self.metrics.generation_tokens_total += len(outputs)
        if finished:
            self._finish(finished)
        if outputs:
            self._sink(outputs)
        for req, message in failed:
            self._fail(req, message)

    def _admit(self, req: Request) -> None:
        params = req.sampling_params
        # Back after a preemption: its output state stays.
        resumed = req.runtime.sampling is not None
        if params.seed is not None and not resumed:
            mx.random.seed(params.seed)  # safe: a seeded request runs alone
        req.runtime.sampling = make_row_sampling(params, req.all_token_ids[:-1], self._xtc_special)
        if not resumed:
            self.metrics.prefix_cache_hit_tokens_total += req.num_cached_tokens

    def _finish(self, reqs: list[Request], status: RequestStatus | None = None) -> None:
        """Retire requests and free their rows in one batch filter; `status` None means by
        their finish reason."""
        for req in reqs:
            by_reason = RequestStatus.FINISHED_STOPPED if req.finish_reason == "stop" else None
            self.scheduler.finish(req, status or by_reason or RequestStatus.FINISHED_LENGTH)
            self._requests.pop(req.request_id, None)
        self.runner.remove(reqs)
