"""Padded sizes that repeat, so traced and compiled shapes are few."""

from __future__ import annotations


def bucket(n: int, minimum: int = 1) -> int:
    """The power of two at or above `n` (and `minimum`): padded sizes that repeat."""
    return max(minimum, 1 << max(n - 1, 0).bit_length())


def fine_bucket(n: int, minimum: int = 1, per_octave: int = 4) -> int:
    """The least of `per_octave` evenly spaced sizes an octave at or above `n` (and
    `minimum`): sizes that repeat, padded by less than 1 / `per_octave` of themselves."""
    n = max(n, minimum)
    step = max(bucket(n) // (2 * per_octave), 1)
    return -(-n // step) * step
