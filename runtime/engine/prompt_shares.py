"""How a paced step's prompt budget is split among the prompts that want tokens."""

from __future__ import annotations

# Least prompt tokens a share gets beside decode rows under `MixedStepCap`: every chunk adds
# its attention calls to the step's fixed cost, so fewer, larger chunks keep that step short.
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
