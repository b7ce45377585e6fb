"""The engine core's side of finishing a request: stop tokens and `max_tokens`, on token ids.

Text (detokenization, stop strings, logprob strings) is the front's job (`OutputProcessor`); a
stop string the front matches comes back to the core as an abort with reason "stop".
"""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.engine.outputs import CoreOutput
from mlx_paged.request import Request


class StopChecker:
    """Turns one sampled token of a request into its `CoreOutput`."""

    def __init__(self, eos_token_ids):
        self.eos_token_ids = frozenset(eos_token_ids)

    def stop_token_ids(self, request: Request) -> frozenset:
        """The ids that end `request`: its own stop ids, plus EOS unless it ignores EOS."""
        ids = request.runtime.stop_token_ids
        if ids is None:
            params = request.sampling_params
            ids = frozenset(params.stop_token_ids) | (
                frozenset() if params.ignore_eos else self.eos_token_ids
            )
            request.runtime.stop_token_ids = ids
        return ids

    def process(self, request: Request, token: int, logprobs: mx.array | None) -> CoreOutput:
        """Account for one sampled token; sets `request.finish_reason` when it ends the request.

        The order is mlx-lm's: reaching max_tokens gives "length", a stop token gives "stop"
        (and wins). A stop token is counted but not emitted.
        """
        params = request.sampling_params
        request.runtime.num_sampled = num_sampled = request.runtime.num_sampled + 1
        out = CoreOutput(
            request.request_id,
            num_prompt_tokens=request.num_prompt_tokens,
            num_generated_tokens=num_sampled,
            num_cached_tokens=request.num_cached_tokens,
        )
        finish: str | None = "length" if num_sampled >= params.max_tokens else None
        if token in self.stop_token_ids(request):
            finish = "stop"
        else:
            request.output_token_ids.append(token)
            out.token_id = token
            if params.logprobs:
                out.logprob, out.top_logprobs = _logprobs(token, logprobs, params.top_logprobs)
        request.finish_reason = out.finish_reason = finish
        return out


def _logprobs(token: int, logprobs: mx.array, top: int) -> tuple[float, list[tuple[int, float]]]:
    value = logprobs[token].item()
    if top <= 0:
        return value, []
    ids = mx.argpartition(-logprobs, top - 1)[:top]
    values = logprobs[ids]
    order = mx.argsort(-values)
    return value, list(zip(ids[order].tolist(), values[order].tolist()))
