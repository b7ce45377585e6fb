"""What a request must satisfy before it is queued: its prompt and sampling against the model's
vocabulary, its context and the KV pool."""

from __future__ import annotations

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


def fit_request(
    prompt_token_ids: list[int],
    params: SamplingParams,
    max_tokens_explicit: bool,
    *,
    vocab_size: int,
    max_model_len: int,
    kv=None,
    pool_flag: str = "--kv-budget",
) -> SamplingParams:
    """Validate a request; a default `max_tokens` may be shortened to fit.

    Args:
        vocab_size: the width of the model's logits (token ids and `top_k` must be below it).
        max_model_len: the longest prompt plus output.
        kv: the paged KV manager, whose pool must hold the whole request; None on the
            contiguous path.
        pool_flag: the flag that sized the pool, named in the error.

    Raises:
        InvalidRequestError: empty or too-long prompt, `max_tokens` beyond the context, bad ids.
    """
    if not prompt_token_ids:
        raise InvalidRequestError("the prompt is empty", param="prompt")
    if any(not 0 <= t < vocab_size for t in prompt_token_ids):
        raise InvalidRequestError(f"prompt token ids must be in [0, {vocab_size})", param="prompt")
    params.validate(vocab_size=vocab_size)
    n = len(prompt_token_ids)
    room = max_model_len - n
    if room < 1:
        raise InvalidRequestError(
            f"the prompt has {n} tokens; this model's context is {max_model_len} tokens "
            f"and needs room for at least one generated token: shorten the prompt",
            param="messages",
            code="context_length_exceeded",
        )
    limit, code = f"the context of {max_model_len} tokens", "context_length_exceeded"
    if kv is not None:
        # The whole request must fit the pool at once (admission keeps one block spare).
        pool_tokens = (kv.block_pool.num_usable_blocks - 1) * kv.block_size
        if pool_tokens - n < room:
            room = pool_tokens - n
            limit, code = f"the KV pool of {pool_tokens} tokens ({pool_flag})", "kv_cache_too_small"
        if room < 1:
            raise InvalidRequestError(
                f"the prompt has {n} tokens and does not fit {limit} with room to generate: "
                f"shorten the prompt or raise {pool_flag}",
                param="messages",
                code=code,
            )
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
