"""How a paced step's prompt budget is split among the prompts that want tokens, and where
their chunks are cut."""

from __future__ import annotations

from mlx_paged.runner.chunk_rows import row_reads, tokens_within_reads

# Least prompt tokens a share gets beside decode rows under `MixedStepCap`, and a chunk cut to
# ride as rows keeps: every chunk adds to the step's fixed cost, so fewer, larger ones.
MIN_DECODING_SHARE = 256


def shared_grants(wants: list[int], budget: int, min_share: int) -> list[int]:
    """Tokens granted to each of `wants` (tokens each prompt wants, in arrival order): first
    the whole of every want of at most `min_share` (a short prompt never waits behind long
    ones), then equal shares of at least `min_share` for as many of the others as they fit,
    then what is left in arrival order."""
    grants, left = [0] * len(wants), budget
    for i, n in enumerate(wants):
        if n <= min(min_share, left):
            grants[i], left = n, left - n
    rest = [i for i, n in enumerate(wants) if not grants[i]]
    if rest:
        num_shares = max(1, min(len(rest), left // max(min_share, 1)))
        share = left // num_shares
        for i in rest[:num_shares]:
            grants[i] = min(wants[i], share)
        left -= sum(grants[i] for i in rest[:num_shares])
    for i, n in enumerate(wants):
        extra = min(n - grants[i], left)
        grants[i] += extra
        left -= extra
    return grants


def aligned_cut(start: int, n: int, budget: int, align: int, first: bool) -> int:
    """Tokens of a chunk of `n` from `start` within `budget`: one cut short ends on a multiple
    of `align`, so the next chunk's offset (an attention shape) repeats; unaligned only when it
    would get no tokens and is the step's first, so prompts always progress."""
    if n <= budget:
        return n
    end = (start + budget) // align * align
    return end - start if end > start else (budget if first else 0)


def within_row_reads(chunks: list[tuple[int, int, int]], reads: int, align: int) -> list[int]:
    """Tokens of the granted chunks `(start, granted, wanted)` of a step with decode rows such
    that they read at most `reads` context tokens a layer as rows of that step
    (`runner/chunk_rows.py`), in order. A chunk that does not fit whole is cut to what fits,
    ending on a multiple of `align`, where that leaves it a share (`MIN_DECODING_SHARE`, or all
    it was granted) and the rest of what it wants fits the reads of one step; else it waits for
    a later step. Where the first chunk cannot be so cut (a long prompt, which rows would take
    in many small steps), the step attends its chunks as prefill: the grants stand."""
    out, left = [], reads
    for start, n, wanted in chunks:
        cost = row_reads(start, n)
        if cost > left:
            end = (start + tokens_within_reads(start, left)) // align * align
            cut = max(end - start, 0)
            fits = cut >= min(MIN_DECODING_SHARE, n)
            fits = fits and row_reads(start + cut, wanted - cut) <= reads
            if not fits and not any(out):
                return [n for _, n, _ in chunks]
            n = cut if fits else 0
            cost = row_reads(start, n)
        out.append(n)
        left -= cost
    return out
