"""What the engine does when a step throws: one request's failure stays its own, and `/health`
says when steps keep failing."""

from __future__ import annotations

import logging

from mlx_paged.engine.fault_isolation import reset_sampling_state
from mlx_paged.request import Request

logger = logging.getLogger("mlx_paged.engine")

# A request in this many failed steps fails; the others in a failed step are retried.
MAX_STEP_FAILURES = 2
# This many failed steps in a row (none succeeding between) and /health reports the engine broken.
BROKEN_AFTER_FAILED_STEPS = 3


class StepRecovery:
    """Mixed into `Engine` (which provides the scheduler, runner, sampling check, `_fail` and
    `is_alive`); its `step` calls `_recover` when a step raised."""

    failed_steps_in_a_row: int = 0
    last_step_error: str | None = None

    def health(self) -> tuple[bool, str]:
        """(healthy, why): its steps are not failing one after another and the thread runs."""
        if self.failed_steps_in_a_row >= BROKEN_AFTER_FAILED_STEPS:
            return False, (
                f"engine broken: the last {self.failed_steps_in_a_row} steps failed "
                f"({self.last_step_error})"
            )
        if not self.is_alive:
            return False, f"engine stopped: {self.error}" if self.error else "engine stopped"
        return True, "ok"

    def _recover(self, exc: Exception) -> None:
        """After a failed step: reset MLX's sampling state, fail the requests whose own
        sampling throws and queue the others again (recomputed from their tokens so far). When
        no request is to blame, each is retried until it was in `MAX_STEP_FAILURES` failed
        steps."""
        self.failed_steps_in_a_row += 1
        self.last_step_error = f"{type(exc).__name__}: {exc}"
        logger.error(
            "engine step failed (%d in a row): %s",
            self.failed_steps_in_a_row,
            self.last_step_error,
            exc_info=self.failed_steps_in_a_row == 1,
        )
        reset_sampling_state()
        in_flight = self.scheduler.running + self.scheduler.prefilling
        culprits = self._failing_sampling(in_flight)
        for req, message in culprits:
            self._fail(req, f"sampling failed for this request's parameters: {message}")
        for req in in_flight if not culprits else ():
            req.runtime.step_failures = failures = req.runtime.step_failures + 1
            if failures >= MAX_STEP_FAILURES:
                self._fail(req, f"engine step failed: {self.last_step_error}")
        self.scheduler.requeue([r for r in in_flight if not r.is_finished])
        self.runner.reset()  # after the requeue: a lost pool also drops the prefix cache

    def _failing_sampling(self, requests: list[Request]) -> list[tuple[Request, str]]:
        """The requests whose sampler or logits processors throw, with the error."""
        failing = []
        for req in requests:
            try:
                if req.runtime.sampling is not None:
                    self._check_sampling.check_row(req.runtime.sampling)
            except Exception as exc:
                failing.append((req, str(exc)))
        return failing
