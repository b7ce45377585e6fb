"""A request's state as it moves through the scheduler, and the prompt work of one step: the
types the engine, its scheduler and the model runners share (they import this, never each
other's)."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from mlx_paged.sampling.sampling_params import SamplingParams

_ids = itertools.count()


def next_request_id() -> str:
    """A new request id, unique in this process."""
    return f"req-{next(_ids)}"


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"
    FINISHED_ERROR = "error"

    @property
    def is_finished(self) -> bool:
        return self.value in ("stop", "length", "abort", "error")


@dataclass(slots=True)
class RequestRuntime:
    """What the engine keeps for a running request beside its tokens."""

    sampling: Any = None  # `RowSampling`, built at admission (kept across preemptions)
    stop_token_ids: frozenset | None = None  # end-of-sequence ids that stop it, built once
    num_sampled: int = 0  # tokens sampled so far, counting any the stop checker held back
    step_failures: int = 0  # failed steps it was part of (fault isolation)
    matcher: Any = None  # its grammar's llguidance matcher (structured output), else None
    # Token ids still to come before the grammar starts (`SamplingParams.grammar_after`),
    # and the last tokens seen while waiting for them.
    grammar_after: tuple[int, ...] = ()
    grammar_seen: tuple[int, ...] = ()

    @property
    def active_matcher(self):
        """The matcher that constrains the next token: None before its grammar starts."""
        return None if self.grammar_after else self.matcher

    def advance_grammar(self, token: int) -> bool:
        """Note an emitted token before the grammar starts (True), starting it once the last
        tokens are `grammar_after`; False when the matcher is to consume the token."""
        if not self.grammar_after:
            return False
        self.grammar_seen = (*self.grammar_seen, token)[-len(self.grammar_after) :]
        if self.grammar_seen == self.grammar_after:
            self.grammar_after = ()
        return True


@dataclass(eq=False)
class Request:
    """One sequence: its prompt, what has been computed, what has been generated.

    `num_computed_tokens` counts prompt tokens whose K/V is in the cache. The scheduler advances
    it; the model runner reads it.
    """

    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    request_id: str = field(default_factory=next_request_id)
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    runtime: RequestRuntime = field(default_factory=RequestRuntime)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens to prefill: the prompt, plus the output so far after a preemption."""
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt plus output: what a preempted request prefills again when it resumes."""
        return self.prompt_token_ids + self.output_token_ids

    @property
    def last_token_id(self) -> int:
        return (self.output_token_ids or self.prompt_token_ids)[-1]

    def token_id_range(self, start: int, stop: int | None = None) -> list[int]:
        """`all_token_ids[start:stop]` (non-negative bounds), copying only that part: a long
        prompt's tail or a chunk of it is short."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            end = None if stop is None else stop - num_prompt
            return self.output_token_ids[start - num_prompt : end]
        if stop is not None and stop <= num_prompt:
            return self.prompt_token_ids[start:stop]
        end = None if stop is None else stop - num_prompt
        return self.prompt_token_ids[start:] + self.output_token_ids[:end]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished


@dataclass(slots=True)
class PromptSchedule:
    """The prompt-side work of one step, in the order the model runner executes it."""

    joining: list[Request] = field(default_factory=list)
    starting: list[Request] = field(default_factory=list)
    prefill: list[tuple[Request, int]] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not (self.joining or self.starting or self.prefill)
