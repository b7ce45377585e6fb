"""A request's token ranges, copied without building prompt + output whole."""

import itertools

import pytest

from mlx_paged.request import Request
from mlx_paged.sampling.sampling_params import SamplingParams


def _request(prompt: list[int], output: list[int]) -> Request:
    request = Request(list(prompt), SamplingParams())
    request.output_token_ids.extend(output)
    return request


@pytest.mark.parametrize("prompt,output", [([1, 2, 3, 4], [5, 6, 7]), ([1, 2], []), ([9], [8])])
def test_token_id_range_is_the_slice_of_all_token_ids(prompt, output):
    request = _request(prompt, output)
    total = len(prompt) + len(output)
    for start, stop in itertools.product(range(total + 1), [None, *range(total + 1)]):
        if stop is not None and stop < start:
            continue
        assert request.token_id_range(start, stop) == request.all_token_ids[start:stop]


def test_last_token_id_is_the_output_s_or_else_the_prompt_s():
    assert _request([1, 2], []).last_token_id == 2
    assert _request([1, 2], [3, 4]).last_token_id == 4
