"""The front's routing of core outputs: text, stop strings that end a request before the
engine does, errors, and failing every open stream."""

from __future__ import annotations

import pytest

from mlx_paged.engine.output_router import OutputRouter
from mlx_paged.engine.outputs import CoreOutput
from mlx_paged.sampling.sampling_params import SamplingParams


class Detokenizer:
    """mlx-lm's streaming detokenizer interface over a fixed id -> text table."""

    def __init__(self, table):
        self.table, self.last_segment = table, ""

    def add_token(self, token):
        self.last_segment = self.table[token]

    def finalize(self):
        self.last_segment = ""


class Tokenizer:
    table = {1: "Hel", 2: "lo", 3: " wor", 4: "ld"}

    @property
    def detokenizer(self):
        return Detokenizer(self.table)

    def decode(self, ids):
        return "".join(self.table[i] for i in ids)


@pytest.fixture
def routed():
    aborts = []
    router = OutputRouter(Tokenizer(), lambda rid, reason: aborts.append((rid, reason)))
    return router, aborts


def drain(stream):
    outs = []
    while not stream.queue.empty():
        outs.append(stream.queue.get())
    return outs


def test_text_increments_and_the_engines_finish(routed):
    router, aborts = routed
    stream = router.open("a", SamplingParams(max_tokens=2))
    router.route([CoreOutput("a", 1, num_generated_tokens=1)])
    router.route([CoreOutput("a", 2, "length", num_generated_tokens=2)])
    outs = drain(stream)
    assert [(o.text, o.token_ids, o.finish_reason) for o in outs] == [
        ("Hel", [1], None),
        ("lo", [2], "length"),
    ]
    assert aborts == [] and router.num_open == 0


def test_a_stop_string_ends_the_request_here_and_aborts_it_there(routed):
    router, aborts = routed
    stream = router.open("a", SamplingParams(max_tokens=9, stop=["o w"]))
    router.route([CoreOutput("a", t) for t in (1, 2, 3)])
    router.route([CoreOutput("a", 4)])  # the engine's next step: dropped, already ended here
    outs = drain(stream)
    assert "".join(o.text for o in outs) == "Hell"
    assert outs[-1].finish_reason == "stop" and len(outs) == 3
    assert aborts == [("a", "stop")]


def test_errors_and_fail_all(routed):
    router, aborts = routed
    bad, other = router.open("a", SamplingParams()), router.open("b", SamplingParams())
    router.route([CoreOutput("a", finish_reason="error", error="boom")])
    router.fail_all("the engine process died")
    assert [(o.finish_reason, o.error) for o in drain(bad)] == [("error", "boom")]
    assert [(o.finish_reason, o.error) for o in drain(other)] == [
        ("error", "the engine process died")
    ]
    assert router.num_open == 0 and aborts == []
