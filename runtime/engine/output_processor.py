"""Turns the engine core's token ids into text increments: incremental detokenization, stop
strings and the strings of log-probabilities. Runs in the front (the HTTP process, or the
consumer's thread offline), never on the engine core."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.engine.outputs import CoreOutput, RequestOutput, TokenLogprob
from mlx_paged.engine.window_detokenizer import streaming_detokenizer
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.sampling.stop_strings import StopStringMatcher


@dataclass(slots=True)
class _RequestText:
    detokenizer: object
    stops: StopStringMatcher


class OutputProcessor:
    """Per-request text state, created when a request is sent and dropped when it ends."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._state: dict[str, _RequestText] = {}

    def add(self, request_id: str, params: SamplingParams) -> None:
        self._state[request_id] = _RequestText(
            streaming_detokenizer(self.tokenizer), StopStringMatcher(params.stop)
        )

    def drop(self, request_id: str) -> None:
        self._state.pop(request_id, None)

    def process(self, core: CoreOutput) -> RequestOutput:
        """The text increment of one core output. A stop string ends the request here
        ("stop") even when the core has not finished it; the caller then aborts it there."""
        state = self._state[core.request_id]
        out = RequestOutput(
            core.request_id,
            num_prompt_tokens=core.num_prompt_tokens,
            num_generated_tokens=core.num_generated_tokens,
            num_cached_tokens=core.num_cached_tokens,
        )
        finish, matched = core.finish_reason, False
        if core.token_id is not None:
            out.token_ids.append(core.token_id)
            if core.logprob is not None:
                out.logprobs.append(self._logprob_entry(core))
            state.detokenizer.add_token(core.token_id)
            out.text, matched = state.stops.feed(state.detokenizer.last_segment)
        if finish is not None and not matched:
            # Bytes held by the detokenizer (an unfinished UTF-8 sequence) come out now.
            state.detokenizer.finalize()
            text, matched = state.stops.feed(state.detokenizer.last_segment)
            out.text += text if matched else text + state.stops.flush()
        out.finish_reason = "stop" if matched else finish
        out.stop_string = state.stops.matched if matched else None
        return out

    def _logprob_entry(self, core: CoreOutput) -> TokenLogprob:
        decode = self.tokenizer.decode
        entry = TokenLogprob(core.token_id, decode([core.token_id]), core.logprob)
        entry.top_logprobs = [(i, decode([i]), v) for i, v in core.top_logprobs]
        return entry
