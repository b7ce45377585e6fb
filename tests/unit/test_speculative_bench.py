"""The speculative benchmark's workloads: copy-heavy prompts hold a text and start it again,
free-form ones are chat requests for a story, all from the standard library."""

from __future__ import annotations

from mlx_paged.bench.speculative import workloads


def test_copy_prompts_start_the_copy_and_free_prompts_ask_for_a_story(tiny_tokenizer):
    loads = workloads(4, tiny_tokenizer)
    assert [len(v) for v in loads.values()] == [4, 4]
    for ids in loads["copy-heavy"]:
        text = tiny_tokenizer.decode(ids)
        body, _, again = text.rpartition("\n\n")
        first = again.removeprefix("```python\n")
        assert first and first in body  # the copy's first line, already in the text
    story = tiny_tokenizer.decode(loads["free-form"][0])
    assert "Write a story about" in story
