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
    stop_string: str | None = None  # the stop string that ended it ("stop"), if one did

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class CoreOutput:
    """What the engine core sends for one request per step: token ids only, no text.

    `token_id` is None when the step emitted no token (a stop token, an abort, an error).
    `logprob` and `top_logprobs` ((id, logprob) pairs) are set when the request asked for them.
    """

    request_id: str
    token_id: int | None = None
    finish_reason: str | None = None
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None

    def __reduce__(self):
        # Pickled as its fields in order: the engine process sends every step's outputs to
        # the front, and the default path through the slots' state costs 2.5x as much.
        return CoreOutput, (
            self.request_id,
            self.token_id,
            self.finish_reason,
            self.logprob,
            self.top_logprobs,
            self.num_prompt_tokens,
            self.num_generated_tokens,
            self.num_cached_tokens,
            self.error,
        )
