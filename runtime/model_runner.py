"""The interface between the engine loop and a KV path (contiguous today, paged next).

A runner owns the model's per-layer caches and the rows' device-side state. The engine calls,
once per step, `decode` for the running rows and then `run_prompts` for the prompt work; finished
or cancelled requests leave through `remove`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import mlx.core as mx

from .request import Request
from .scheduler import PromptSchedule


@dataclass(slots=True)
class RowOutput:
    """One generated token: the token, and the log-probabilities it was sampled from."""

    request: Request
    token: int
    logprobs: mx.array  # (V,)


class ModelRunner(ABC):
    """Runs the model over one KV layout; see the module docstring for the call order."""

    @abstractmethod
    def decode(self, rows: list[Request]) -> list[RowOutput]:
        """Run one decode forward over `rows` (the scheduler's running order) and return one
        token per row."""

    @abstractmethod
    def run_prompts(self, plan: PromptSchedule) -> None:
        """Admit `plan.joining`, run the last prompt token of `plan.starting` (they decode from
        the next step on) and prefill the chunks in `plan.prefill`."""

    @abstractmethod
    def remove(self, requests: list[Request]) -> None:
        """Drop the rows of finished or cancelled requests and free their KV."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every row (after a failed step); the runner is then empty and usable."""

    @property
    @abstractmethod
    def kv_bytes_in_use(self) -> int:
        """Bytes of KV memory currently held."""
