"""The contiguous KV path: left-padded batch caches, reused from mlx-lm.

This is the parity fallback (`--kv-paged off`). It performs the same forwards, on the same cache
objects (`BatchKVCache` / `BatchRotatingKVCache` through `make_prompt_cache` + `merge`), in the
same order as mlx-lm's `BatchGenerator`, so greedy tokens match it exactly. That includes the
one-step lookahead: a decode step evaluates the tokens sampled by the previous step while the
next ones are computed asynchronously.
"""

from __future__ import annotations

import copy
import logging

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from mlx_paged.request import PromptSchedule, Request
from mlx_paged.runner.batch_check import batching_is_exact
from mlx_paged.runner.model_runner import LookaheadDecoder, ModelRunner, RowOutput

logger = logging.getLogger(__name__)


def _merge(per_request_caches: list[list]) -> list:
    """Per-request, per-layer caches -> per-layer batch caches."""
    return [type(layer[0]).merge(list(layer)) for layer in zip(*per_request_caches)]


def _extend(batch_a: list, batch_b: list) -> list:
    if not batch_a:
        return batch_b
    for a, b in zip(batch_a, batch_b):
        a.extend(b)
    return batch_a


def _filter(batch: list, keep: list[int]) -> list:
    if not keep:
        return []
    for c in batch:
        c.filter(keep)
    return batch


def _right_pad(chunks: list[list[int]], length: int) -> mx.array:
    return mx.array([c + [0] * (length - len(c)) for c in chunks])


class ContiguousRunner(LookaheadDecoder, ModelRunner):
    """Prompt rows live in one left-padded batch cache, decode rows in another."""

    def __init__(self, model, prefill_step_size: int = 2048):
        self.model = model
        self.prefill_step_size = prefill_step_size
        self.reset()
        if not all(hasattr(c, "merge") for c in make_prompt_cache(model)):
            raise ValueError(f"{type(model).__module__}: its caches cannot be batched (no merge)")
        # Where batching changes a row's tokens, the engine runs one request at a time.
        self.batches_exactly = batching_is_exact(model, _merge)
        if not self.batches_exactly:
            logger.warning(
                "%s: mlx-lm's batched caches give this model other tokens than it gets alone "
                "(prompts of different lengths in one batch), so the contiguous path runs one "
                "request at a time",
                type(model).__module__,
            )

    def reset(self) -> None:
        self.prompt_rows: list[Request] = []
        self.prompt_cache: list = []
        self.decode_cache: list = []
        self.reset_decode()

    @property
    def kv_bytes_in_use(self) -> int:
        return sum(c.nbytes for c in self.prompt_cache + self.decode_cache)

    def decode(self, rows: list[Request]) -> list[RowOutput]:
        return self.lookahead_step(
            rows, lambda inputs: self.model(inputs[:, None], cache=self.decode_cache)[:, -1, :]
        )

    def run_prompts(self, plan: PromptSchedule) -> None:
        if plan.joining:
            caches = [make_prompt_cache(self.model) for _ in plan.joining]
            self.prompt_cache = _extend(self.prompt_cache, _merge(caches))
            self.prompt_rows.extend(plan.joining)
        if plan.starting:
            self._start(plan.starting)
        if plan.prefill:
            self._prefill(plan.prefill)

    def _start(self, starting: list[Request]) -> None:
        starting_ids = {id(r) for r in starting}
        moved = [i for i, r in enumerate(self.prompt_rows) if id(r) in starting_ids]
        keep = [i for i, r in enumerate(self.prompt_rows) if id(r) not in starting_ids]
        # Split the prompt batch as BatchGenerator does: a copy keeps the moved rows.
        cache = copy.deepcopy(self.prompt_cache) if keep else self.prompt_cache
        cache = _filter(cache, moved)
        self.prompt_cache = _filter(self.prompt_cache, keep) if keep else []
        rows = [self.prompt_rows[i] for i in moved]
        self.prompt_rows = [self.prompt_rows[i] for i in keep]

        inputs = mx.array([r.last_token_id for r in rows])
        logits = self.model(inputs[:, None], cache=cache)[:, -1, :]
        self.start_rows(rows, logits, inputs)
        self.decode_cache = _extend(self.decode_cache, cache)

    def _prefill(self, prefill: list[tuple[Request, int]]) -> None:
        if [r.request_id for r, _ in prefill] != [r.request_id for r in self.prompt_rows]:
            raise RuntimeError("prefill rows differ from the runner's prompt batch order")
        chunks = [
            r.token_id_range(r.num_computed_tokens - n, r.num_computed_tokens) for r, n in prefill
        ]
        lengths = [len(c) for c in chunks]
        max_length = max(lengths)
        padding = [max_length - n for n in lengths]
        if max(padding) > 0:
            tokens = _right_pad(chunks, max_length)
            for c in self.prompt_cache:
                c.prepare(lengths=lengths, right_padding=padding)
        else:
            tokens = mx.array(chunks)
        while tokens.shape[1] > 0:
            n = min(self.prefill_step_size, tokens.shape[1])
            self.model(tokens[:, :n], cache=self.prompt_cache)
            mx.eval([c.state for c in self.prompt_cache])
            mx.clear_cache()
            tokens = tokens[:, n:]
        if max(padding) > 0:
            for c in self.prompt_cache:
                c.finalize()
            mx.eval([c.state for c in self.prompt_cache])
            mx.clear_cache()

    def remove(self, requests: list[Request]) -> None:
        keep = self.drop_decode_rows(requests)
        if keep is not None:
            self.decode_cache = _filter(self.decode_cache, keep)
        gone = {id(r) for r in requests}
        keep = [i for i, r in enumerate(self.prompt_rows) if id(r) not in gone]
        if len(keep) < len(self.prompt_rows):
            self.prompt_cache = _filter(self.prompt_cache, keep)
            self.prompt_rows = [self.prompt_rows[i] for i in keep]
