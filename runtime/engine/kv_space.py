"""`KVSpace`: what the scheduler asks of a paged KV path (`KVCacheManager` provides it)."""

from __future__ import annotations

from typing import Protocol

from mlx_paged.request import Request


class KVSpace(Protocol):
    """What the scheduler asks of a paged KV path."""

    def admit(self, request: Request) -> bool:
        """Find prefix-cache hits, allocate the prefill's blocks and set the request's
        `num_computed_tokens` to the hit; False (and nothing changed) if it does not fit."""

    def allocate_decode(self, request: Request) -> bool:
        """Room for one more token at position `num_computed_tokens`; False if the pool is dry."""

    def allocate_chunk(self, request: Request, num_tokens: int) -> bool:
        """Room for a prefilling request's next `num_tokens` where blocks are taken chunk by
        chunk (sliding-window groups); False if the pool is dry (nothing taken)."""

    def free(self, request: Request, cache_computed: bool = False) -> None:
        """Release the request's blocks (finished, aborted or preempted); `cache_computed`
        keeps a decoding request's computed blocks findable by the prefix cache."""
