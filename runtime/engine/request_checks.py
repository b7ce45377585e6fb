"""What a request must satisfy before it is queued: its prompt and sampling against the model's
vocabulary, its context and the KV pool."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.errors import InvalidRequestError
from mlx_paged.sampling.sampling_params import SamplingParams

_CONTEXT_KEYS = (
    "max_position_embeddings",
    "max_sequence_length",
    "seq_length",
    "n_positions",
    "max_seq_len",
    "n_ctx",
)


def context_length(config: dict) -> int | None:
    """The model's context length from its config.json, when it states one."""
    for source in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            if isinstance(source.get(key), int) and source[key] > 0:
                return source[key]
    return None


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What bounds a request, known once the engine has loaded (plain numbers, so the front
    process can check requests without the model).

    Attributes:
        vocab_size: the width of the model's logits (token ids and `top_k` must be below it).
        max_model_len: the longest prompt plus output.
        pool_tokens: the tokens the paged KV pool holds for one request (one block stays
            spare for admission); None on the contiguous path.
        pool_flag: the flag that sized the pool, named in the error.
    """

    vocab_size: int
    max_model_len: int
    pool_tokens: int | None = None
    pool_flag: str = "--kv-budget"

    def fit(
        self, prompt_token_ids: list[int], params: SamplingParams, max_tokens_explicit: bool
    ) -> SamplingParams:
        """Validate a request; a default `max_tokens` may be shortened to fit.

        Raises:
            InvalidRequestError: empty or too-long prompt, `max_tokens` beyond the context or
                the pool, bad ids or sampling parameters out of range.
        """
        if not prompt_token_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if any(not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise InvalidRequestError(
                f"prompt token ids must be in [0, {self.vocab_size})", param="prompt"
            )
        params.validate(vocab_size=self.vocab_size)
        n = len(prompt_token_ids)
        room, limit, code = self._room(n)
        if params.max_tokens > room:
            if max_tokens_explicit:
                raise InvalidRequestError(
                    f"max_tokens ({params.max_tokens}) plus the prompt ({n} tokens) exceeds "
                    f"{limit}: ask for at most {room}",
                    param="max_tokens",
                    code=code,
                )
            params.max_tokens = room
        return params

    def _room(self, n: int) -> tuple[int, str, str]:
        """(tokens left to generate, what limits them, the error code) for an n-token prompt."""
        room = self.max_model_len - n
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {n} tokens; this model's context is {self.max_model_len} "
                f"tokens and needs room for at least one generated token: shorten the prompt",
                param="messages",
                code="context_length_exceeded",
            )
        limit, code = f"the context of {self.max_model_len} tokens", "context_length_exceeded"
        if self.pool_tokens is not None and self.pool_tokens - n < room:
            room = self.pool_tokens - n
            limit = f"the KV pool of {self.pool_tokens} tokens ({self.pool_flag})"
            code = "kv_cache_too_small"
            if room < 1:
                raise InvalidRequestError(
                    f"the prompt has {n} tokens and does not fit {limit} with room to "
                    f"generate: shorten the prompt or raise {self.pool_flag}",
                    param="messages",
                    code=code,
                )
        return room, limit, code
