"""Split a reasoning model's output into its thinking and its answer, for chat templates with
thinking markers (`<think>` … `</think>`: Qwen3, DeepSeek-R1 and kin, as mlx-lm detects them).

A prompt that ends inside a thinking block (the template opened it) starts in thinking; else
the model may open one itself. Text that could be the start of a marker is held back until it
is known not to be one, so no marker reaches either side.
"""

from __future__ import annotations

from mlx_paged.sampling.stop_strings import partial_suffix_len


class ReasoningSplitter:
    """Feed text increments; get back (thinking, answer) increments."""

    def __init__(self, start: str, end: str, thinking: bool):
        self.start, self.end = start, end
        self.thinking = thinking
        self._held = ""
        self._answer_opens = False  # line breaks that open the answer after a block are dropped

    def feed(self, text: str) -> tuple[str, str]:
        thought, answer = [], []
        held = self._held + text
        while True:
            if self._answer_opens:
                held = held.lstrip("\n")
                self._answer_opens = not held
            marker = self.end if self.thinking else self.start
            at = held.find(marker)
            if at < 0:
                break
            (thought if self.thinking else answer).append(held[:at])
            held = held[at + len(marker) :]
            self.thinking = not self.thinking
            self._answer_opens = not self.thinking
        keep = partial_suffix_len(held, [self.end if self.thinking else self.start])
        (thought if self.thinking else answer).append(held[: len(held) - keep])
        self._held = held[len(held) - keep :]
        return "".join(thought), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """The held-back text, at the end of the output."""
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)


def reasoning_splitter(tokenizer, prompt_token_ids: list[int]) -> ReasoningSplitter | None:
    """The splitter of a chat answer to `prompt_token_ids`, for tokenizers with thinking
    markers; None for the others."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    opened = tokenizer.rfind_think_start(prompt_token_ids)
    inside = opened >= 0 and opened > tokenizer.rfind_think_end(prompt_token_ids)
    return ReasoningSplitter(tokenizer.think_start, tokenizer.think_end, inside)


class AnswerParser:
    """A chat answer's increments as (thinking, text, tool calls): thinking split off first
    (`ReasoningSplitter`), then tool calls taken out of the answer (`ToolCallExtractor`);
    either may be None."""

    def __init__(self, reasoning: ReasoningSplitter | None, tools):
        self.reasoning, self.tools = reasoning, tools

    @property
    def num_calls(self) -> int:
        return self.tools.num_calls if self.tools is not None else 0

    def feed(self, text: str) -> tuple[str, str, list[dict]]:
        thought, answer = self.reasoning.feed(text) if self.reasoning else ("", text)
        piece, calls = self.tools.feed(answer) if self.tools else (answer, [])
        return thought, piece, calls

    def flush(self) -> tuple[str, str, list[dict]]:
        """What is held back, at the end of the output."""
        thought, answer = self.reasoning.flush() if self.reasoning else ("", "")
        piece, calls = self.tools.feed(answer) if self.tools else (answer, [])
        if self.tools:
            rest, more = self.tools.flush()
            piece, calls = piece + rest, calls + more
        return thought, piece, calls
