"""The interface between the engine loop and a KV path: contiguous (`ContiguousRunner`) or paged
(`PagedRunner`).

A runner owns the model's per-layer caches and the rows' device-side state. The engine calls,
once per step, `decode` for the running rows and then `run_prompts` for the prompt work; finished
or cancelled requests leave through `remove`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import mlx.core as mx

from mlx_paged.request import PromptSchedule, Request
from mlx_paged.sampling.sampler import sample
from mlx_paged.structured.matchers import GrammarMatchers, constrain


@dataclass(slots=True)
class RowOutput:
    """One generated token: the token, and the log-probabilities it was sampled from."""

    request: Request
    token: int
    logprobs: mx.array | None  # (V,), for requests that asked for logprobs


class ModelRunner(ABC):
    """Runs the model over one KV layout; see the module docstring for the call order."""

    @abstractmethod
    def decode(self, rows: list[Request]) -> list[RowOutput]:
        """Run one decode forward over `rows` (the scheduler's running order) and return one
        token per row."""

    @abstractmethod
    def run_prompts(self, plan: PromptSchedule) -> None:
        """Admit `plan.joining`, run the last prompt token of `plan.starting` (they decode from
        the next step on) and prefill the chunks in `plan.prefill`."""

    @abstractmethod
    def remove(self, requests: list[Request]) -> None:
        """Drop the rows of finished or cancelled requests and free their KV."""

    @abstractmethod
    def reset(self) -> None:
        """Drop every row (after a failed step); the runner is then empty and usable."""

    @property
    @abstractmethod
    def kv_bytes_in_use(self) -> int:
        """Bytes of KV memory currently held."""


class LookaheadDecoder:
    """The decode batch's one-step lookahead, shared by the runners (mlx-lm's GenerationBatch
    pattern): each forward feeds the tokens sampled by the previous one and returns them, while
    its own samples are computed asynchronously."""

    # Seconds decode steps waited for the device to finish the previous step's samples.
    device_wait_seconds: float = 0.0
    # Seconds pipelined decode steps spent building their graph (inputs, forward, sampling;
    # with grammars, the masks too) and in MLX's dispatch of it (`mx.async_eval`).
    build_seconds: float = 0.0
    dispatch_seconds: float = 0.0
    # Masks of the rows with a grammar (structured output); the engine sets it.
    grammars: GrammarMatchers | None = None

    def reset_decode(self) -> None:
        self.decode_rows: list[Request] = []
        # Requests whose pending token `emit_pending` already returned: the next step skips it.
        self.emitted_ids: set[str] = set()
        self.next_tokens = None  # (B,) tokens sampled last step, fed in this step
        # Per row, the log-probabilities its next token was sampled from; None for rows that
        # did not ask for logprobs, so no step splits the batch's (B, V) array for them.
        self.next_logprobs: list[mx.array | None] = []

    def lookahead_step(self, rows: list[Request], forward, pending_writes=None) -> list[RowOutput]:
        """Feed the pending tokens through `forward(inputs) -> (B, V) logits`, sample the next
        ones, and return the fed tokens with the log-probabilities they were sampled from.
        `pending_writes()` returns arrays the forward updated, to evaluate with the samples."""
        if [r.request_id for r in rows] != [r.request_id for r in self.decode_rows]:
            raise RuntimeError("decode rows differ from the runner's batch order")
        inputs, current_logprobs = self.next_tokens, self.next_logprobs
        tic, waited = time.perf_counter(), self.device_wait_seconds
        logits = forward(inputs)
        # Rows waiting for their grammar to start count too: a fed token may start it.
        constrained = any(r.runtime.matcher is not None for r in rows)
        if constrained:  # the masks need the fed tokens: filled while the forward is encoded
            outputs = self._fed_outputs(rows, inputs, current_logprobs)
            filling = self.grammars.start_masks([r.runtime.active_matcher for r in rows])
            mx.async_eval(logits)
            logits = constrain(logits, mx.array(filling.result()))
        tokens, logprobs, contexts = sample(logits, inputs, [r.runtime.sampling for r in rows])
        self.next_tokens, self.next_logprobs = tokens, _rows_asking(rows, logprobs)
        writes = pending_writes() if pending_writes else ()
        built = time.perf_counter()
        mx.async_eval(tokens, _present(self.next_logprobs), contexts, writes)
        self.dispatch_seconds += time.perf_counter() - built
        self.build_seconds += built - tic - (self.device_wait_seconds - waited)
        if not constrained:
            outputs = self._fed_outputs(rows, inputs, current_logprobs)
        return outputs

    def _fed_outputs(self, rows, inputs: mx.array, logprobs: list) -> list[RowOutput]:
        """Wait for the fed tokens and return those that are outputs, advancing the grammar
        matchers of their requests by them."""
        tic = time.perf_counter()
        mx.eval(inputs, _present(logprobs))
        self.device_wait_seconds += time.perf_counter() - tic
        outputs = [RowOutput(r, t, lp) for r, t, lp in zip(rows, inputs.tolist(), logprobs)]
        if self.emitted_ids:  # rare: first tokens `emit_pending` already handed out
            outputs = [o for o in outputs if o.request.request_id not in self.emitted_ids]
            self.emitted_ids.clear()
        self._advance_matchers(outputs)
        return outputs

    def _advance_matchers(self, outputs: list[RowOutput]) -> None:
        fed = [(o.request.runtime.matcher, o.token) for o in outputs
               if o.request.runtime.matcher is not None
               and not o.request.runtime.advance_grammar(o.token)]  # fmt: skip
        if fed:
            self.grammars.consume(fed)

    def emit_pending(self) -> list[RowOutput]:
        """Wait for the pending tokens (the first ones of rows that just started) and return
        them now instead of with the next step; that step then returns them no more. It costs
        the overlap of building the next step with the device, so the engine calls it only
        when no other row decodes."""
        mx.eval(self.next_tokens, _present(self.next_logprobs))
        pending = zip(self.decode_rows, self.next_tokens.tolist(), self.next_logprobs)
        emitted = self.emitted_ids
        outputs = [RowOutput(r, t, lp) for r, t, lp in pending if r.request_id not in emitted]
        emitted.update(o.request.request_id for o in outputs)
        self._advance_matchers(outputs)
        return outputs

    def start_rows(self, rows: list[Request], logits: mx.array, inputs: mx.array) -> None:
        """Sample the first tokens of requests whose last prompt token gave `logits`, and append
        them to the decode batch (their tokens come out at the next decode step)."""
        matchers = [r.runtime.active_matcher for r in rows]
        if any(m is not None for m in matchers):
            logits = constrain(logits, self.grammars.masks(matchers))
        tokens, logprobs, contexts = sample(logits, inputs, [r.runtime.sampling for r in rows])
        wanted = _rows_asking(rows, logprobs)
        mx.async_eval(tokens, _present(wanted), contexts)
        if self.next_tokens is None or not self.decode_rows:
            self.next_tokens = tokens
        else:
            self._feed_next(mx.concatenate([self.next_tokens, tokens]))
        self.next_logprobs.extend(wanted)
        self.decode_rows.extend(rows)

    def join_rows(self, rows: list[Request]) -> None:
        """Append requests whose prompt is computed but for its last token to the decode batch:
        the next decode step feeds that token with the batch's, and its sample is their first
        token (out with the step after). The fed prompt token is no output."""
        # uint32, as samplers return: a compiled step is traced per input dtype.
        fed = [r.token_id_range(r.num_computed_tokens - 1, r.num_computed_tokens)[0] for r in rows]
        fed = mx.array(fed, mx.uint32)
        if self.next_tokens is None or not self.decode_rows:
            self.next_tokens = fed
        else:
            self._feed_next(mx.concatenate([self.next_tokens, fed.astype(self.next_tokens.dtype)]))
        self.next_logprobs.extend([None] * len(rows))
        self.decode_rows.extend(rows)
        self.emitted_ids.update(r.request_id for r in rows)

    def drop_decode_rows(self, requests: list[Request]) -> list[int] | None:
        """Remove `requests` from the decode batch; the kept indices, or None if none left."""
        gone = {id(r) for r in requests}
        self.emitted_ids -= {r.request_id for r in requests}  # one may come back, resumed
        keep = [i for i, r in enumerate(self.decode_rows) if id(r) not in gone]
        if len(keep) == len(self.decode_rows):
            return None
        self.decode_rows = [self.decode_rows[i] for i in keep]
        if keep:
            self._feed_next(self.next_tokens[mx.array(keep)])
        else:
            self.next_tokens = None
        self.next_logprobs = [self.next_logprobs[i] for i in keep]
        return keep

    def _feed_next(self, tokens: mx.array) -> None:
        """Make `tokens`, an array built from the pending ones, the next step's fed tokens,
        scheduled now: scheduled by that step's `async_eval`, it would share the step's end
        event, and waiting for it would wait for the whole step (no overlap)."""
        self.next_tokens = tokens
        mx.async_eval(tokens)


def _rows_asking(rows: list[Request], logprobs: mx.array) -> list[mx.array | None]:
    """Row `i`'s `logprobs[i]` where its request asked for logprobs, else None."""
    return [logprobs[i] if r.sampling_params.logprobs else None for i, r in enumerate(rows)]


def _present(arrays: list[mx.array | None]) -> list[mx.array]:
    return [a for a in arrays if a is not None]
