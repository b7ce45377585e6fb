"""Stop strings over streamed text: a stop string is never emitted, not even when it arrives split
across several tokens, and nothing that might be the start of one is emitted early."""

from __future__ import annotations

from collections.abc import Sequence


def partial_suffix_len(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `patterns`."""
    best = 0
    for pattern in patterns:
        for k in range(min(len(pattern) - 1, len(text)), best, -1):
            if text.endswith(pattern[:k]):
                best = k
                break
    return best


class StopStringMatcher:
    """Holds back the shortest tail of the text that could still grow into a stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text, once one did

    def feed(self, text: str) -> tuple[str, bool]:
        """Add generated text; return (text safe to emit, whether a stop string matched).

        After a match, the returned text is everything before the stop string and the rest is
        dropped.
        """
        if not self.stops:
            return text, False
        held = self._held + text
        hits = [(i, s) for i, s in ((held.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            self._held = ""
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return held[:at], True
        keep = partial_suffix_len(held, self.stops)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        """The held-back text, once generation ended for another reason."""
        held, self._held = self._held, ""
        return held
