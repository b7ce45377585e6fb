"""Keep one request's failure from spreading: check a request's sampling before it joins a batch,
and put MLX's global sampling state back after anything threw.

mlx-lm's samplers are `mx.compile`d with the global random state as an input and an output. When
one throws while being traced, that state is left holding a placeholder array, and every later
sampling call fails with "Attempting to eval an array without a primitive" until it is reseeded.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Sequence

import mlx.core as mx

from mlx_paged.sampling.sampler import RowSampling, _cached_sampler, make_row_sampling
from mlx_paged.sampling.sampling_params import SamplingParams


def reset_sampling_state() -> None:
    """Reseed MLX's random state from fresh entropy and drop the cached samplers, so nothing a
    failed call left behind is used again."""
    mx.random.seed(int.from_bytes(os.urandom(8), "little"))
    _cached_sampler.cache_clear()


class SamplingCheck:
    """Runs a request's sampler and logits processors once on a dummy row of the model's logits
    shape, so a request whose sampling throws fails alone, before it shares a step.

    Samplers are shared by settings (see `sampler._cached_sampler`); each one is checked once.
    Logits processors are per request and checked every time.
    """

    def __init__(self, vocab_size: int, dtype: mx.Dtype, xtc_special_tokens: Sequence[int]):
        self.vocab_size = vocab_size
        self.dtype = dtype
        self.xtc_special_tokens = tuple(xtc_special_tokens)
        self._passed: weakref.WeakSet = weakref.WeakSet()

    def __call__(self, params: SamplingParams) -> None:
        """Raise what sampling with `params` would raise inside a step."""
        row = make_row_sampling(params, [0], self.xtc_special_tokens)
        if row.sampler not in self._passed or row.processors:
            self.check_row(row)

    def check_row(self, row: RowSampling) -> None:
        """Run one request's sampler and processors on a dummy row; on failure the MLX state
        is reset and the exception raised."""
        logits = mx.zeros((1, self.vocab_size), dtype=self.dtype)
        try:
            if row.processors:
                context = mx.array([0])
                for processor in row.processors:
                    logits = processor(context, logits)
                if logits.shape != (1, self.vocab_size):
                    raise ValueError(f"logits processors returned shape {logits.shape}")
            mx.eval(row.sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True)))
        except Exception:
            reset_sampling_state()
            self._passed = weakref.WeakSet()
            raise
        self._passed.add(row.sampler)
