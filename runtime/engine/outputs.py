"""What the engine streams back for each request."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TokenLogprob:
    """One emitted token with its log-probability and, when asked, the most likely alternatives."""

    token_id: int
    token: str
    logprob: float
    top_logprobs: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(slots=True)
class RequestOutput:
    """An increment of one request's output; the last one has `finished` set.

    `text` and `token_ids` are the new part only. `error` is set when the engine failed the
    request; `finish_reason` is then "error".
    """

    request_id: str
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
