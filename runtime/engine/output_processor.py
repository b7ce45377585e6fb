"""Turns sampled tokens into text increments: EOS and stop tokens, max_tokens, incremental
detokenization, stop strings and log-probabilities. Runs on the engine thread."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlx_paged.engine.outputs import RequestOutput, TokenLogprob
from mlx_paged.engine.request import Request
from mlx_paged.sampling.stop_strings import StopStringMatcher


@dataclass(slots=True)
class _RequestText:
    detokenizer: object
    stops: StopStringMatcher
    stop_token_ids: frozenset


class OutputProcessor:
    """Per-request text state, created when a request is admitted and dropped when it ends."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self._state: dict[str, _RequestText] = {}

    def add(self, request: Request) -> None:
        params = request.sampling_params
        stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop_ids |= self.eos_token_ids
        self._state[request.request_id] = _RequestText(
            self.tokenizer.detokenizer, StopStringMatcher(params.stop), frozenset(stop_ids)
        )

    def drop(self, request: Request) -> None:
        self._state.pop(request.request_id, None)

    def process(self, request: Request, token: int, logprobs: mx.array | None) -> RequestOutput:
        """Account for one sampled token; sets `request.finish_reason` when it ends the request.

        The order is mlx-lm's: reaching max_tokens gives "length", a stop token gives "stop"
        (and wins). A stop token is counted but neither emitted as text nor as a token id.
        """
        state = self._state[request.request_id]
        params = request.sampling_params
        out = RequestOutput(
            request.request_id,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=request.num_cached_tokens,
        )
        request.runtime["num_sampled"] = num_sampled = request.runtime.get("num_sampled", 0) + 1
        finish: str | None = "length" if num_sampled >= params.max_tokens else None
        if token in state.stop_token_ids:
            finish = "stop"
        else:
            request.output_token_ids.append(token)
            out.token_ids.append(token)
            if params.logprobs:
                out.logprobs.append(self._logprob_entry(token, logprobs, params.top_logprobs))
            state.detokenizer.add_token(token)
            text, matched = state.stops.feed(state.detokenizer.last_segment)
            out.text = text
            if matched:
                finish = "stop"
        if finish is not None:
            if finish != "stop" or token in state.stop_token_ids:
                # Bytes held by the detokenizer (an unfinished UTF-8 sequence) come out now.
                state.detokenizer.finalize()
                text, matched = state.stops.feed(state.detokenizer.last_segment)
                out.text += text if matched else text + state.stops.flush()
                finish = "stop" if matched else finish
            request.finish_reason = finish
            out.finish_reason = finish
        out.num_generated_tokens = num_sampled
        return out

    def _logprob_entry(self, token: int, logprobs: mx.array, top: int) -> TokenLogprob:
        entry = TokenLogprob(token, self.tokenizer.decode([token]), logprobs[token].item())
        if top > 0:
            ids = mx.argpartition(-logprobs, top - 1)[:top]
            values = logprobs[ids]
            order = mx.argsort(-values)
            for i, v in zip(ids[order].tolist(), values[order].tolist()):
                entry.top_logprobs.append((i, self.tokenizer.decode([i]), v))
        return entry
