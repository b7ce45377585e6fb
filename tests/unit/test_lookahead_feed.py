"""The lookahead's fed tokens: rebuilt when rows join or leave the batch, they are scheduled at
once, so that the next step's wait for them is not a wait for that whole step."""

import mlx.core as mx
import pytest

from mlx_paged.request import Request
from mlx_paged.runner.model_runner import LookaheadDecoder
from mlx_paged.sampling.sampling_params import SamplingParams


class Batch(LookaheadDecoder):
    def __init__(self):
        self.reset_decode()


def req(name: str, n: int) -> Request:
    r = Request(list(range(1, n + 1)), SamplingParams())
    r.request_id = name
    r.num_computed_tokens = n
    return r


@pytest.fixture
def scheduled(monkeypatch):
    """The arrays each `mx.async_eval` call was given (the call still runs)."""
    calls = []
    real = mx.async_eval

    def recording(*arrays):
        calls.append(arrays)
        return real(*arrays)

    monkeypatch.setattr(mx, "async_eval", recording)
    return calls


def test_rows_joining_a_batch_get_fed_tokens_scheduled_on_their_own(scheduled):
    batch = Batch()
    batch.join_rows([req("a", 5)])
    assert scheduled == []  # the first row's fed token is a constant: nothing to schedule
    first = batch.next_tokens
    batch.join_rows([req("b", 3), req("c", 4)])
    assert batch.next_tokens is not first
    assert len(scheduled) == 1 and scheduled[0][0] is batch.next_tokens
    assert batch.next_tokens.tolist() == [5, 3, 4]


def test_rows_leaving_a_batch_get_the_kept_tokens_scheduled_on_their_own(scheduled):
    batch = Batch()
    rows = [req("a", 5), req("b", 3), req("c", 4)]
    batch.join_rows(rows)
    scheduled.clear()
    assert batch.drop_decode_rows([rows[1]]) == [0, 2]
    assert len(scheduled) == 1 and scheduled[0][0] is batch.next_tokens
    assert batch.next_tokens.tolist() == [5, 4]
    assert batch.drop_decode_rows(rows) == []
    assert batch.next_tokens is None and len(scheduled) == 1
