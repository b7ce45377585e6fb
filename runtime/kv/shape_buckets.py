"""Padded sizes that repeat, so traced and compiled shapes are few."""

from __future__ import annotations


def bucket(n: int, minimum: int = 1) -> int:
    """The power of two at or above `n` (and `minimum`): padded sizes that repeat."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())
