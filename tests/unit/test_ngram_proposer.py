"""Prompt lookup drafts: the tokens after the most recent earlier occurrence of the longest
matching suffix, from prompt and output alike, within the limit."""

from __future__ import annotations

import pytest

from mlx_paged.request import Request
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.speculative.ngram import NgramProposer


def _request(prompt: list[int], output: list[int] = ()) -> Request:
    req = Request(list(prompt), SamplingParams())
    req.output_token_ids.extend(output)
    return req


def test_drafts_follow_the_most_recent_match_of_the_longest_suffix():
    proposer = NgramProposer(3)
    # 2 3 appears twice before; the longer suffix 1 2 3 only once, and it wins.
    req = _request([1, 2, 3, 4, 9, 7, 2, 3, 8, 5, 1, 2])
    assert proposer.propose(req, [3], limit=10) == [4, 9, 7]
    # With 1 2 3 gone, the most recent 2 3 drafts.
    other = _request([2, 3, 4, 9, 7, 2, 3, 8, 5, 6, 2])
    assert proposer.propose(other, [3], limit=10) == [8, 5, 6]


def test_the_output_and_the_tail_extend_the_sequence_incrementally():
    proposer = NgramProposer(4)
    req = _request([5, 6, 7, 8])
    assert proposer.propose(req, [9], limit=4) == []
    req.output_token_ids.extend([9, 5])  # the tail came out, and one more token
    assert proposer.propose(req, [6], limit=4) == [7, 8, 9, 5]
    assert proposer.propose(req, [6], limit=2) == [7, 8]
    req.output_token_ids.append(6)
    assert proposer.propose(req, [], limit=4) == [7, 8, 9, 5]


def test_no_draft_without_a_match_room_or_a_long_enough_suffix():
    proposer = NgramProposer(3, max_ngram=3, min_ngram=2)
    assert proposer.propose(_request([1, 2, 3]), [4], limit=3) == []
    assert proposer.propose(_request([1, 2, 1]), [2], limit=0) == []
    # Only a 1-gram (4) repeats: below min_ngram.
    assert proposer.propose(_request([4, 1, 2, 4]), [], limit=3) == []
    proposer.forget("missing")  # forgetting an unknown request is harmless


def test_a_long_sequence_grows_its_buffer():
    proposer = NgramProposer(2)
    req = _request(list(range(100)))
    assert proposer.propose(req, [0, 1], limit=2) == [2, 3]
    req.output_token_ids.extend(range(100, 400))
    assert proposer.propose(req, [150, 151], limit=5) == [152, 153]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        NgramProposer(0)
    with pytest.raises(ValueError):
        NgramProposer(2, max_ngram=1, min_ngram=2)


def _brute_force(tokens: list[int], limit: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The definition: for the longest suffix of n tokens (max_ngram down to min_ngram) that
    appeared earlier with a token after it, the tokens after its most recent occurrence."""
    for n in range(min(max_ngram, len(tokens) - 1), min_ngram - 1, -1):
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        if starts:
            return tokens[starts[-1] + n : starts[-1] + n + limit]
    return []


def test_drafts_equal_the_brute_force_definition_on_random_sequences():
    import random

    rng = random.Random(0)
    for case in range(400):
        tokens = [rng.randrange(1, 2 + case % 7) for _ in range(rng.randrange(1, 60))]
        max_ngram = rng.randrange(1, 6)
        min_ngram = rng.randrange(1, max_ngram + 1)
        proposer = NgramProposer(5, max_ngram=max_ngram, min_ngram=min_ngram)
        got = proposer.propose(_request(tokens), [], limit=5)
        assert got == _brute_force(tokens, 5, max_ngram, min_ngram), (tokens, max_ngram, min_ngram)
