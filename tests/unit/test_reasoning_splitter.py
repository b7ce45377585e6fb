"""`ReasoningSplitter`: thinking and answer apart, markers split over increments never leak."""

from __future__ import annotations

import pytest

from mlx_paged.server.reasoning import ReasoningSplitter


def split(pieces, thinking: bool) -> tuple[str, str]:
    splitter = ReasoningSplitter("<think>", "</think>", thinking)
    thought, answer = [], []
    for piece in pieces:
        t, a = splitter.feed(piece)
        thought.append(t)
        answer.append(a)
    t, a = splitter.flush()
    return "".join(thought) + t, "".join(answer) + a


@pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
def test_a_prompt_that_opened_the_block(size):
    text = "Paris is big.\nSo: Paris.</think>\n\nThe capital is Paris."
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    assert split(pieces, thinking=True) == ("Paris is big.\nSo: Paris.", "The capital is Paris.")


@pytest.mark.parametrize("size", [1, 4, 100])
def test_a_model_that_opens_the_block_itself(size):
    text = "<think>hmm</think>Answer <thi"
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    assert split(pieces, thinking=False) == ("hmm", "Answer <thi")


def test_no_markers_is_all_answer_or_all_thinking():
    assert split(["plain < text"], thinking=False) == ("", "plain < text")
    assert split(["still thinking </thi"], thinking=True) == ("still thinking </thi", "")
