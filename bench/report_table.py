"""Markdown tables for the generated benchmark docs."""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table of `rows` under `header`."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
