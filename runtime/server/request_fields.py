"""The sampling fields of an OpenAI request body, each type-checked and named when refused."""

from __future__ import annotations

from mlx_paged.errors import InvalidRequestError
from mlx_paged.sampling.sampling_params import SamplingParams

MAX_TOKENS_LIMIT = 1_000_000
NUMBER = (int, float)


def err(message: str, param: str | None = None, status: int = 400, code: str | None = None):
    """The `InvalidRequestError` that names `param`."""
    return InvalidRequestError(message, param=param, status=status, code=code)


def typed(body: dict, name: str, types, default=None, *, label: str):
    """`body[name]` (or `default` when absent or null) if it is of `types`; a bool passes only
    where `types` names it."""
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise err(f"{name} must be {label}, got a boolean", name)
    if not isinstance(value, types):
        raise err(f"{name} must be {label}, got {type(value).__name__}", name)
    return value


def sampling_params(body: dict, defaults: dict, *, chat: bool) -> tuple[SamplingParams, bool]:
    """The request's `SamplingParams` (server `defaults` where it sets nothing) and whether it
    set its own token limit."""
    max_tokens, explicit = _max_tokens(body, defaults, chat)
    logprobs, top = _logprobs(body, chat)
    number = NUMBER
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=typed(body, "temperature", number, defaults["temperature"], label="a number"),
        top_p=typed(body, "top_p", number, defaults["top_p"], label="a number"),
        top_k=typed(body, "top_k", int, defaults["top_k"], label="an integer"),
        min_p=typed(body, "min_p", number, defaults["min_p"], label="a number"),
        repetition_penalty=typed(body, "repetition_penalty", number, None, label="a number"),
        repetition_context_size=typed(body, "repetition_context_size", int, 20, label="an integer"),
        presence_penalty=typed(body, "presence_penalty", number, None, label="a number"),
        frequency_penalty=typed(body, "frequency_penalty", number, None, label="a number"),
        xtc_probability=typed(body, "xtc_probability", number, 0.0, label="a number"),
        xtc_threshold=typed(body, "xtc_threshold", number, 0.1, label="a number"),
        logit_bias=_logit_bias(body),
        seed=typed(body, "seed", int, None, label="an integer"),
        stop=_stop(body),
        logprobs=logprobs,
        top_logprobs=top,
        speculate=typed(body, "speculate", bool, True, label="a boolean"),
    )
    return params, explicit


def _max_tokens(body: dict, defaults: dict, chat: bool) -> tuple[int, bool]:
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        return defaults["max_tokens"], False
    name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise err(f"{name} must be an integer", name)
    if max_tokens < 1:
        raise err(f"{name} must be at least 1, got {max_tokens}", name)
    if max_tokens > MAX_TOKENS_LIMIT:
        raise err(
            f"{name} ({max_tokens}) is absurdly large; the limit is the model's context length",
            name,
        )
    return max_tokens, True


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise err("stop must be a string or a list of strings", "stop")
    return stop


def _logit_bias(body: dict) -> dict | None:
    bias = body.get("logit_bias")
    if bias is None:
        return None
    if not isinstance(bias, dict):
        raise err("logit_bias must be an object mapping token ids to biases", "logit_bias")
    try:
        return {int(k): v for k, v in bias.items()}
    except (TypeError, ValueError):
        raise err("logit_bias keys must be token ids (integers)", "logit_bias") from None


def _logprobs(body: dict, chat: bool) -> tuple[bool, int]:
    """(logprobs, top_logprobs): chat's boolean + count, or completions' one integer."""
    if chat:
        logprobs = typed(body, "logprobs", bool, False, label="a boolean")
        top = typed(body, "top_logprobs", int, 0, label="an integer")
        if top and not logprobs:
            raise err("top_logprobs needs logprobs: true", "top_logprobs")
        return logprobs, top
    top = typed(body, "logprobs", int, None, label="an integer")
    return top is not None, top or 0
