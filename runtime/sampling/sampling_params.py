"""Per-request generation options and their validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlx_paged.errors import InvalidRequestError

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
MAX_TOP_LOGPROBS = 20
MAX_PENALTY = 100.0
MAX_CONTEXT_SIZE = 2**31 - 1  # MLX slices with 32-bit indices
MAX_SEED = 2**64 - 1  # mx.random.seed takes an unsigned 64-bit integer
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "xtc_probability",
    "xtc_threshold",
)


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(f"{param}: {message}", param=param)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


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
    repetition_penalty: float | None = None
    repetition_context_size: int = 20
    presence_penalty: float | None = None
    presence_context_size: int = 20
    frequency_penalty: float | None = None
    frequency_context_size: int = 20
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    # An llguidance grammar the output must follow (`structured/grammars.py`), else None.
    grammar: str | None = None
    # Token ids after which the grammar starts (the end of a thinking block): the output up
    # to and with them is free. Empty: the grammar constrains the output from its first token.
    grammar_after: list[int] = field(default_factory=list)
    # Whether this request's rows may carry speculative drafts (where the engine has a drafter).
    speculate: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()
        # MLX turns a Python int into an int64 array: 10**19 would throw inside the step.
        for name in _FLOAT_FIELDS:
            if getattr(self, name) is not None:
                setattr(self, name, float(getattr(self, name)))
        if self.logit_bias:
            self.logit_bias = {k: float(v) for k, v in self.logit_bias.items()}

    @property
    def is_batchable(self) -> bool:
        """Whether the request may share a batch (a fixed seed needs the sampler to itself)."""
        return self.seed is None

    def validate(self, vocab_size: int | None = None) -> None:
        """Raise `InvalidRequestError` naming the first field that is out of range; with
        `vocab_size` (the width of the model's logits), token ids and `top_k` are checked too."""
        self._validate_sampling()
        self._validate_penalties()
        self._validate_output()
        if vocab_size is not None:
            self._validate_for_vocabulary(vocab_size)

    def _validate_sampling(self) -> None:
        _check(_is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens",
               "must be an integer >= 1")  # fmt: skip
        _check(_is_number(self.temperature) and 0 <= self.temperature <= 100, "temperature",
               "must be a number in [0, 100]")  # fmt: skip
        _check(_is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "must be in (0, 1]")
        _check(_is_int(self.top_k) and self.top_k >= 0, "top_k",
               "must be an integer >= 0 (0 turns it off)")  # fmt: skip
        _check(_is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "must be in [0, 1]")
        _check(_is_number(self.xtc_probability) and 0 <= self.xtc_probability <= 1,
               "xtc_probability", "must be in [0, 1]")  # fmt: skip
        _check(_is_number(self.xtc_threshold) and 0 <= self.xtc_threshold <= 0.5,
               "xtc_threshold", "must be in [0, 0.5]")  # fmt: skip
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed <= MAX_SEED), "seed",
               f"must be an integer in [0, {MAX_SEED}]")  # fmt: skip
        if self.logit_bias is not None:
            _check(
                isinstance(self.logit_bias, dict)
                and all(_is_int(k) and _is_number(v) and -100 <= v <= 100
                        for k, v in self.logit_bias.items()),
                "logit_bias", "must map token ids to numbers in [-100, 100]",
            )  # fmt: skip

    def _validate_penalties(self) -> None:
        _check(
            self.repetition_penalty is None
            or (_is_number(self.repetition_penalty) and 0 < self.repetition_penalty <= MAX_PENALTY),
            "repetition_penalty", f"must be a number in (0, {MAX_PENALTY:g}]",
        )  # fmt: skip
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(value is None or (_is_number(value) and -2 <= value <= 2), name,
                   "must be a number in [-2, 2]")  # fmt: skip
        for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
            value = getattr(self, name)
            _check(_is_int(value) and 1 <= value <= MAX_CONTEXT_SIZE, name,
                   f"must be an integer in [1, {MAX_CONTEXT_SIZE}]")  # fmt: skip

    def _validate_output(self) -> None:
        _check(
            isinstance(self.stop, list) and len(self.stop) <= MAX_STOP_STRINGS
            and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LENGTH for s in self.stop),
            "stop", f"must be a string or a list of at most {MAX_STOP_STRINGS} non-empty strings "
            f"of at most {MAX_STOP_LENGTH} characters",
        )  # fmt: skip
        _check(isinstance(self.stop_token_ids, list)
               and all(_is_int(t) for t in self.stop_token_ids),
               "stop_token_ids", "must be a list of token ids")  # fmt: skip
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be a boolean")
        _check(isinstance(self.speculate, bool), "speculate", "must be a boolean")
        _check(isinstance(self.logprobs, bool), "logprobs", "must be a boolean")
        _check(_is_int(self.top_logprobs) and 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS,
               "top_logprobs", f"must be an integer in [0, {MAX_TOP_LOGPROBS}]")  # fmt: skip
        _check(self.grammar is None or isinstance(self.grammar, str), "grammar",
               "must be a grammar string")  # fmt: skip
        _check(isinstance(self.grammar_after, list)
               and all(_is_int(t) for t in self.grammar_after)
               and (self.grammar is not None or not self.grammar_after),
               "grammar_after", "must be a list of token ids, with a grammar")  # fmt: skip

    def _validate_for_vocabulary(self, vocab_size: int) -> None:
        # mlx-lm's top-k sampler takes k in (0, vocabulary size).
        _check(
            self.top_k < vocab_size,
            "top_k",
            f"must be below the vocabulary size ({vocab_size}); 0 turns it off",
        )
        named = [("logit_bias", list((self.logit_bias or {}).keys())),
                 ("stop_token_ids", self.stop_token_ids),
                 ("grammar_after", self.grammar_after)]  # fmt: skip
        for param, ids in named:
            bad = next((t for t in ids if not 0 <= t < vocab_size), None)
            _check(bad is None, param,
                   f"token id {bad} is outside the vocabulary (size {vocab_size})")  # fmt: skip
