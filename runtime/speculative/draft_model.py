"""Drafts from a smaller model sharing the tokenizer (`--draft-model PATH`), with its own paged
KV in a pool of its own, sized out of the same budget as the target's.

Each request's draft cache holds K/V for a prefix of its tokens (`known`). A step feeds every
drafting row the tokens the target has and the draft cache lacks (its prompt, the first time)
in one prefill forward, takes the draft model's likeliest next token, and feeds that back for
K - 1 more one-token forwards. A row further behind than a step's catch-up budget (the
engine's prefill chunk) is fed that many of its tokens in the same first forward and drafts
from a later step, so a long prompt never runs as one forward. Drafts are greedy: a draft
that is one token for sure keeps the target's verification rule exact
(`runner/speculative_step.py`). After verification the cache keeps only what the target
accepted (`accept`), and gives back the blocks past it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx

from mlx_paged.kv.kv_cache_manager import cdiv
from mlx_paged.runner.group_metadata import prefill_metadata


@dataclass(slots=True)
class _DraftRow:
    """A request as the draft pool's manager sees it: its id and the tokens its cache holds."""

    request_id: str
    num_computed_tokens: int = 0
    all_token_ids: list[int] = field(default_factory=list)  # unused: no prefix caching here


class DraftModelProposer:
    """Drafts of up to `num_draft_tokens` tokens from `runner`'s model (a `PagedRunner` over
    the draft pool, whose forwards this borrows) and its manager `kv`; rows behind by more
    than `max_catch_up` tokens catch up that many a step."""

    def __init__(self, runner, kv, num_draft_tokens: int, max_catch_up: int = 2048):
        self.runner, self.kv = runner, kv
        self.num_draft_tokens = num_draft_tokens
        self.max_catch_up = max_catch_up
        self._rows: dict[str, _DraftRow] = {}

    def propose_batch(self, requests, tails: list[list[int]], limits: list[int]):
        """Per request, up to `min(limit, K)` tokens after its tokens and `tail`; none where
        the draft pool has no room."""
        drafts: list[list[int]] = [[] for _ in requests]
        rows, chunks, picked, behind = [], [], [], []
        budget = self.max_catch_up
        for i, (request, tail, limit) in enumerate(zip(requests, tails, limits)):
            if limit < 1:
                continue
            row = self._rows.setdefault(request.request_id, _DraftRow(request.request_id))
            chunk = request.token_id_range(row.num_computed_tokens) + tail
            catch_up = len(chunk) > budget
            if catch_up:  # this step feeds what the budget allows, and drafts nothing
                chunk = chunk[:budget]
            room = len(chunk) + (0 if catch_up else self.num_draft_tokens - 1)
            if not chunk or self.kv.allocate_slots(row, room) is None:
                continue
            budget -= len(chunk)
            (behind if catch_up else rows).append((row, chunk, i))
        if not rows and not behind:
            return drafts
        rows, chunks, picked = (list(x) for x in zip(*(rows + behind)))
        tokens = self._first_tokens(rows, chunks)[: len(rows) - len(behind)]
        rows, picked = rows[: len(tokens)], picked[: len(tokens)]
        for step in range(self.num_draft_tokens if rows else 0):
            for i, token in zip(picked, tokens):
                drafts[i].append(token)
            if step + 1 < self.num_draft_tokens:
                tokens = self._next_tokens(rows, tokens)
        return [d[:limit] for d, limit in zip(drafts, limits)]

    def accept(self, request, num_tokens: int) -> None:
        """The target holds `num_tokens` tokens of `request` now: the draft cache keeps at
        most those and frees its blocks past them."""
        row = self._rows.get(request.request_id)
        if row is not None:
            row.num_computed_tokens = min(row.num_computed_tokens, num_tokens)
            self.kv.trim(row, row.num_computed_tokens)

    def forget(self, request_id: str) -> None:
        """Free a finished (or preempted) request's draft cache."""
        row = self._rows.pop(request_id, None)
        if row is not None:
            self.kv.free(row)

    def _first_tokens(self, rows: list[_DraftRow], chunks: list[list[int]]) -> list[int]:
        """Feed each row its chunk in one forward; the likeliest token after each."""
        counts = [len(c) for c in chunks]
        align = self.runner.pool.prefill_align
        width = cdiv(max(counts), align) * align
        starts = [r.num_computed_tokens for r in rows]
        return self._forward(rows, [c + [0] * (width - len(c)) for c in chunks], starts, counts)

    def _next_tokens(self, rows: list[_DraftRow], tokens: list[int]) -> list[int]:
        """Feed each row its last drafted token; the likeliest token after each."""
        starts = [r.num_computed_tokens for r in rows]
        return self._forward(rows, [[t] for t in tokens], starts, [1] * len(rows))

    def _forward(self, rows, tokens: list[list[int]], starts, counts) -> list[int]:
        metas = prefill_metadata(self.kv, rows, starts, counts, len(tokens[0]))
        logits = self.runner._forward(mx.array(tokens), metas)
        last = mx.array([n - 1 for n in counts])
        picked = mx.argmax(logits[mx.arange(len(rows)), last], axis=-1)
        mx.eval(picked, self.runner.pool.pages)
        for row, n in zip(rows, counts):
            row.num_computed_tokens += n
        return picked.tolist()
