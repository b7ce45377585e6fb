"""Per-request generation options and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from .errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TOP_LOGPROBS = 20


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param}: {message}", param=param)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(slots=True)
class SamplingParams:
    """How to sample one request; the field names follow vLLM and mlx_lm.server.

    `temperature == 0` is greedy. Penalties of `None` are off. A request with a `seed` is not
    batchable: it runs alone once the running batch has drained (mlx_lm.server's rule).
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: Optional[float] = None
    repetition_context_size: int = 20
    presence_penalty: Optional[float] = None
    presence_context_size: int = 20
    frequency_penalty: Optional[float] = None
    frequency_context_size: int = 20
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: Optional[dict[int, float]] = None
    seed: Optional[int] = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    @property
    def is_batchable(self) -> bool:
        """Whether the request may share a batch (a fixed seed needs the sampler to itself)."""
        return self.seed is None

    def validate(self, vocab_size: Optional[int] = None) -> None:
        """Raise `InvalidRequestError` naming the first field that is out of range."""
        _check(isinstance(self.max_tokens, int) and not isinstance(self.max_tokens, bool)
               and self.max_tokens >= 1, "max_tokens", "must be an integer >= 1")
        _check(_is_number(self.temperature) and 0 <= self.temperature <= 100, "temperature",
               "must be a number in [0, 100]")
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, "top_k", "must be an integer >= 0")
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        _check(self.repetition_penalty is None or (_is_number(self.repetition_penalty)
               and self.repetition_penalty > 0), "repetition_penalty", "must be a number > 0")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(value is None or (_is_number(value) and -2 <= value <= 2), name,
                   "must be a number in [-2, 2]")
        for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= 1, name, "must be an integer >= 1")
        _check(_is_number(self.xtc_probability) and 0 <= self.xtc_probability <= 1,
               "xtc_probability", "must be in [0, 1]")
        _check(_is_number(self.xtc_threshold) and 0 <= self.xtc_threshold <= 0.5,
               "xtc_threshold", "must be in [0, 0.5]")
        _check(self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)),
               "seed", "must be an integer")
        _check(isinstance(self.stop, list) and len(self.stop) <= MAX_STOP_STRINGS
               and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in self.stop),
               "stop", f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings "
               f"of at most {MAX_STOP_LENGTH} characters")
        _check(isinstance(self.top_logprobs, int) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               "top_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")
        if self.logit_bias is not None:
            _check(isinstance(self.logit_bias, dict) and all(
                isinstance(k, int) and _is_number(v) and -100 <= v <= 100
                for k, v in self.logit_bias.items()), "logit_bias",
                "must map token ids to numbers in [-100, 100]")
        if vocab_size is not None:
            ids = list((self.logit_bias or {}).keys()) + list(self.stop_token_ids)
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                param = "logit_bias" if bad[0] in (self.logit_bias or {}) else "stop_token_ids"
                _check(False, param, f"token id {bad[0]} is outside the vocabulary "
                       f"(size {vocab_size})")
