"""Split generated text into plain content and tool calls, for chat templates that mark calls
with start/end strings (mlx-lm infers them and a parser from the template)."""

from __future__ import annotations

import json
import logging
import uuid

from mlx_paged.sampling.stop_strings import partial_suffix_len

logger = logging.getLogger(__name__)


class ToolCallExtractor:
    """Feed text increments; get back content to emit and finished tool calls.

    Text that could be the start marker is held back until it is known not to be one.
    """

    def __init__(self, start: str, end: str, parser, tools):
        self.start, self.end, self.parser, self.tools = start, end, parser, tools
        self._buf = ""
        self._in_call = False
        self.num_calls = 0

    def feed(self, text: str) -> tuple[str, list[dict]]:
        content, calls = "", []
        self._buf += text
        while True:
            marker = self.end if self._in_call else self.start
            i = self._buf.find(marker)
            if i < 0:
                break
            if self._in_call:
                calls += self._parse(self._buf[:i])
            else:
                content += self._buf[:i]
            self._buf = self._buf[i + len(marker) :]
            self._in_call = not self._in_call
        if not self._in_call:
            keep = partial_suffix_len(self._buf, [self.start])
            content += self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
        return content, calls

    def flush(self) -> tuple[str, list[dict]]:
        """End of generation: an unterminated call is parsed if it can be, else dropped."""
        buf, self._buf = self._buf, ""
        if self._in_call:
            self._in_call = False
            return "", self._parse(buf)
        return buf, []

    def _parse(self, text: str) -> list[dict]:
        try:
            parsed = self.parser(text.strip(), self.tools)
        except (ValueError, json.JSONDecodeError) as exc:
            logger.warning("could not parse a tool call (%s); dropping it", exc)
            return []
        out = []
        for call in parsed if isinstance(parsed, list) else [parsed]:
            arguments = call.get("arguments", {})
            out.append(
                {
                    "index": self.num_calls,
                    "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {
                        "name": call.get("name"),
                        "arguments": arguments
                        if isinstance(arguments, str)
                        else json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
            self.num_calls += 1
        return out
