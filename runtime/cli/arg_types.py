"""Argument types the serve flags share: numbers checked at parse time."""

from __future__ import annotations

import argparse


def positive_float(text: str) -> float:
    """A flag's value > 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A flag's value >= 0."""
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def ratio_or_zero(text: str) -> float:
    """A flag's ratio above 1, or 0 (off)."""
    value = float(text)
    if not (value == 0 or value > 1):
        raise argparse.ArgumentTypeError(f"must be above 1 (or 0: off), got {text}")
    return value


def positive(text: str) -> int:
    """A flag's integer value >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value
