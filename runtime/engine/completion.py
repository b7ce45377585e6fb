"""What the Python API hands back: a whole result per prompt, or its increments as they come."""

from __future__ import annotations

from dataclasses import dataclass, field

from mlx_paged.engine.outputs import RequestOutput, TokenLogprob


class GenerationError(RuntimeError):
    """The engine failed a request (its message says why)."""


@dataclass(slots=True)
class CompletionResult:
    """The whole output of one prompt."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache


@dataclass(slots=True)
class CompletionDelta:
    """One increment of a streamed prompt: the new text and token ids. The last one has
    `finished` set and carries the whole `result`."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] = field(default_factory=list)
    result: CompletionResult | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None


class ResultBuilder:
    """Folds a request's `RequestOutput` increments into deltas and its `CompletionResult`."""

    def __init__(self, request_id: str, prompt_token_ids: list[int]):
        self.result = CompletionResult(request_id, list(prompt_token_ids), [], "", None)

    @property
    def finished(self) -> bool:
        return self.result.finish_reason is not None

    def add(self, out: RequestOutput) -> CompletionDelta:
        """The delta `out` makes; raises `GenerationError` when the engine failed the request."""
        self.fold(out)
        res = self.result
        delta = CompletionDelta(res.request_id, out.text, list(out.token_ids), list(out.logprobs))
        if out.finished:
            delta.result = res
        return delta

    def fold(self, out: RequestOutput) -> None:
        """Add `out` to the result, building no delta (whole results only)."""
        if out.error or out.finish_reason in ("abort", "error"):
            raise GenerationError(out.error or f"the request ended: {out.finish_reason}")
        res = self.result
        res.token_ids += out.token_ids
        res.text += out.text
        if out.logprobs:
            res.logprobs += out.logprobs
        if out.finish_reason is not None:
            res.finish_reason = out.finish_reason
            res.num_cached_tokens = out.num_cached_tokens
