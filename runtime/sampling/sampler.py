"""Per-row sampling over a batch of logits, through `mlx_lm.sample_utils`.

The order is mlx-lm's GenerationBatch step: logits processors per row (each fed that row's token
context), log-softmax, then one batched sampler call when every row shares a sampler object (the
common case: identical settings share one cached sampler), else one call per row.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import TokenBuffer
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlx_paged.sampling.sampling_params import SamplingParams

Sampler = Callable[[mx.array], mx.array]
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]


@functools.lru_cache(maxsize=1024)
def _cached_sampler(
    temp: float,
    top_p: float,
    min_p: float,
    top_k: int,
    xtc_probability: float,
    xtc_threshold: float,
    xtc_special_tokens: tuple[int, ...],
) -> Sampler:
    return make_sampler(
        temp=temp,
        top_p=top_p,
        min_p=min_p,
        top_k=top_k,
        xtc_probability=xtc_probability,
        xtc_threshold=xtc_threshold,
        xtc_special_tokens=list(xtc_special_tokens),
    )


@dataclass(slots=True)
class RowSampling:
    """What one request samples with; built once when it is admitted."""

    sampler: Sampler
    processors: tuple[LogitsProcessor, ...]
    context: TokenBuffer | None  # only rows with processors keep their token history


def make_row_sampling(
    params: SamplingParams, prompt: Sequence[int], xtc_special_tokens: Sequence[int] = ()
) -> RowSampling:
    """Build the sampler and logits processors for one request.

    Args:
        params: the request's sampling parameters.
        prompt: the prompt tokens already in the cache (the processors' initial context).
        xtc_special_tokens: tokens XTC never removes (EOS, newline), as mlx_lm.server does.
    """
    sampler = _cached_sampler(
        float(params.temperature),
        float(params.top_p),
        float(params.min_p),
        int(params.top_k),
        float(params.xtc_probability),
        float(params.xtc_threshold),
        tuple(xtc_special_tokens),
    )
    processors = tuple(
        make_logits_processors(
            logit_bias=params.logit_bias,
            repetition_penalty=params.repetition_penalty,
            repetition_context_size=params.repetition_context_size,
            presence_penalty=params.presence_penalty,
            presence_context_size=params.presence_context_size,
            frequency_penalty=params.frequency_penalty,
            frequency_context_size=params.frequency_context_size,
        )
    )
    return RowSampling(sampler, processors, TokenBuffer(list(prompt)) if processors else None)


def sample(logits: mx.array, inputs: mx.array, rows: Sequence[RowSampling]):
    """Sample one token per row.

    Args:
        logits: `(B, V)` last-position logits.
        inputs: `(B,)` the tokens that were fed to produce `logits` (they extend each context).
        rows: one `RowSampling` per row.

    Returns:
        `(tokens (B,), logprobs (B, V), contexts)`; `contexts` are arrays to evaluate with them.
    """
    contexts = []
    if any(r.processors for r in rows):
        processed = []
        for i, row in enumerate(rows):
            row_logits = logits[i : i + 1]
            if row.processors:
                context = row.context.update_and_fetch(inputs[i : i + 1])
                contexts.append(context)
                for processor in row.processors:
                    row_logits = processor(context, row_logits)
            processed.append(row_logits)
        logits = mx.concatenate(processed, axis=0)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    first = rows[0].sampler
    if all(r.sampler is first for r in rows):
        tokens = first(logprobs)
    else:
        tokens = mx.concatenate([r.sampler(logprobs[i : i + 1]) for i, r in enumerate(rows)])
    return tokens, logprobs, contexts
