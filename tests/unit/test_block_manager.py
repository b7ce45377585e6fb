"""Block pool and KV cache manager: exact block ids, ref counts and free-queue order."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlx_paged.kv.block_pool import BlockPool
from mlx_paged.kv.kv_cache_manager import KVCacheManager
from mlx_paged.kv.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    hash_block_tokens,
    hash_request_blocks,
)


@dataclass
class Req:
    request_id: str
    tokens: list[int]
    num_computed_tokens: int = 0
    extra: list[int] = field(default_factory=list)

    @property
    def all_token_ids(self):
        return self.tokens + self.extra

    @property
    def num_prefill_tokens(self):
        return len(self.tokens) + len(self.extra)

    def token_id_range(self, start, stop=None):
        return self.all_token_ids[start:stop]


def free_ids(pool: BlockPool) -> list[int]:
    return [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_free_queue_is_o1_linked_list_with_lru_order():
    blocks = [KVCacheBlock(i) for i in range(5)]
    q = FreeKVCacheBlockQueue(blocks)
    assert q.num_free_blocks == 5
    q.remove(blocks[2])
    assert [b.block_id for b in q.get_all_free_blocks()] == [0, 1, 3, 4]
    assert q.popleft() is blocks[0]
    q.append(blocks[2])
    assert [b.block_id for b in q.get_all_free_blocks()] == [1, 3, 4, 2]
    with pytest.raises(ValueError):
        q.append(blocks[3])
    with pytest.raises(ValueError):
        q.remove(blocks[0])


def test_chained_hash_depends_on_parent_tokens_and_extra_keys():
    a = hash_block_tokens(None, [1, 2])
    assert hash_block_tokens(None, [1, 2]) == a
    assert hash_block_tokens(a, [1, 2]) != a
    assert hash_block_tokens(None, [1, 2], ("lora-1",)) != a
    assert hash_request_blocks([1, 2, 3, 4, 5], 2) == [a, hash_block_tokens(a, [3, 4])]


def test_null_block_is_never_handed_out():
    pool = BlockPool(4)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert [b.block_id for b in pool.get_new_blocks(3)] == [1, 2, 3]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


def test_allocate_free_and_prefix_hit_exact_ids_and_order():
    m = KVCacheManager(num_blocks=10, block_size=4)
    pool = m.block_pool
    a = Req("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert m.get_computed_blocks(a) == ([[]], 0)
    assert [b.block_id for b in m.allocate_slots(a, 10)] == [1, 2, 3]
    a.num_computed_tokens = 10
    m.cache_blocks(a, 10)
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [1, 1, 1]
    assert free_ids(pool) == [4, 5, 6, 7, 8, 9]

    # Same 8-token prefix: the two full blocks are shared, the rest is new.
    b = Req("b", list(range(8)) + [99, 98, 97])
    hits, n = m.get_computed_blocks(b)
    assert ([h.block_id for h in hits[0]], n) == ([1, 2], 8)
    assert [x.block_id for x in m.allocate_slots(b, 3, hits)] == [4]
    assert m.get_block_ids(b) == [1, 2, 4]
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 4)] == [2, 2, 1]

    # Free in reverse: tails reach the free queue first.
    m.free(a)
    assert [pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [1, 1, 0]
    assert free_ids(pool) == [5, 6, 7, 8, 9, 3]
    m.free(b)
    assert free_ids(pool) == [5, 6, 7, 8, 9, 3, 4, 2, 1]
    assert pool.num_free_blocks == pool.num_usable_blocks

    # A hit on free cached blocks revives them in O(1), out of the middle of the queue.
    c = Req("c", list(range(8)) + [7])
    hits, n = m.get_computed_blocks(c)
    assert ([h.block_id for h in hits[0]], n) == ([1, 2], 8)
    assert [x.block_id for x in m.allocate_slots(c, 1, hits)] == [5]
    assert free_ids(pool) == [6, 7, 8, 9, 3, 4]


def test_hit_leaves_the_last_token_to_compute():
    m = KVCacheManager(num_blocks=10, block_size=4)
    a = Req("a", list(range(8)))
    m.allocate_slots(a, 8)
    m.cache_blocks(a, 8)
    same = Req("same", list(range(8)))
    hits, n = m.get_computed_blocks(same)
    assert ([h.block_id for h in hits[0]], n) == ([1], 4)  # not both: the last token needs logits


def test_eviction_is_lazy_and_lru():
    m = KVCacheManager(num_blocks=4, block_size=2)
    pool = m.block_pool
    a = Req("a", [1, 2, 3, 4, 5])
    m.allocate_slots(a, 5)
    m.cache_blocks(a, 5)
    m.free(a)
    assert len(pool.cached_block_hash_to_block) == 2  # still cached while free
    assert free_ids(pool) == [3, 2, 1]
    b = Req("b", [9, 9, 9])  # needs 2 blocks: takes 3 (uncached) then 2 (evicts [3, 4])
    assert [x.block_id for x in m.allocate_slots(b, 3)] == [3, 2]
    assert [blk.block_id for blk in pool.cached_block_hash_to_block.values()] == [1]
    hits, _ = m.get_computed_blocks(Req("c", [1, 2, 3, 4, 5]))
    assert [h.block_id for h in hits[0]] == [1]


def test_allocation_that_does_not_fit_changes_nothing():
    m = KVCacheManager(num_blocks=4, block_size=2)
    a = Req("a", [1, 2, 3, 4])
    assert m.allocate_slots(a, 4) is not None
    before = free_ids(m.block_pool)
    assert m.allocate_slots(Req("b", [5] * 6), 6) is None
    assert free_ids(m.block_pool) == before and m.get_block_ids(Req("b", [])) == []


def test_decode_growth_allocates_a_block_only_at_boundaries():
    m = KVCacheManager(num_blocks=6, block_size=2)
    a = Req("a", [1, 2, 3])
    assert [b.block_id for b in m.allocate_slots(a, 3)] == [1, 2]
    a.num_computed_tokens = 3
    assert m.allocate_slots(a, 1) == []  # token 4 fits in block 2
    a.num_computed_tokens = 4
    assert [b.block_id for b in m.allocate_slots(a, 1)] == [3]


def test_allocate_decode_takes_a_block_only_at_boundaries_and_when_the_pool_has_one():
    m = KVCacheManager(num_blocks=4, block_size=2)
    a = Req("a", [1, 2, 3])
    m.allocate_slots(a, 3)
    a.num_computed_tokens = 3
    assert m.allocate_decode(a) and m.get_block_ids(a) == [1, 2]  # token 4 fits in block 2
    a.num_computed_tokens = 4
    assert m.allocate_decode(a) and m.get_block_ids(a) == [1, 2, 3]
    a.num_computed_tokens = 5
    assert m.allocate_decode(a) and m.block_pool.num_free_blocks == 0
    a.num_computed_tokens = 6
    assert not m.allocate_decode(a) and m.get_block_ids(a) == [1, 2, 3]  # the pool is dry


def _decode(m: KVCacheManager, r: Req, token: int) -> None:
    """One decode step as the engine runs it: room for the fed token, then its id is known."""
    assert m.allocate_decode(r)
    r.num_computed_tokens += 1
    r.extra.append(token)


def test_decoded_blocks_are_cached_and_the_next_turn_hits_prompt_and_answer():
    m = KVCacheManager(num_blocks=8, block_size=2)
    a = Req("a", [1, 2, 3])
    m.allocate_slots(a, 3)
    a.num_computed_tokens = 3
    m.cache_blocks(a, 3)
    _decode(m, a, 9)  # fills block 2 with [3, 9]
    _decode(m, a, 8)  # caches block 2 before taking block 3
    assert m.get_computed_blocks(Req("b", [1, 2, 3, 9, 5])) == ([m.get_blocks(a)[:2]], 4)
    _decode(m, a, 7)  # [8, 7] is full but cached only when the request goes on or leaves
    assert m.get_computed_blocks(Req("c", [1, 2, 3, 9, 8, 7, 5]))[1] == 4
    m.free(a, cache_computed=True)
    assert m.get_computed_blocks(Req("c", [1, 2, 3, 9, 8, 7, 5]))[1] == 6


def test_only_known_tokens_are_cached():
    m = KVCacheManager(num_blocks=8, block_size=2)
    a = Req("a", [1, 2, 3])
    m.allocate_slots(a, 3)
    a.num_computed_tokens = 3
    assert m.allocate_decode(a)
    a.num_computed_tokens = 4  # the fed token's id is not known yet (its step failed)
    m.free(a, cache_computed=True)
    assert m.get_computed_blocks(Req("b", [1, 2, 3, 0, 5]))[1] == 2


def test_free_without_cache_computed_caches_nothing_new():
    m = KVCacheManager(num_blocks=8, block_size=2)
    a = Req("a", [1, 2, 3, 4, 5])
    m.allocate_slots(a, 5)
    a.num_computed_tokens = 5  # scheduled, but its step failed: the K/V is not trusted
    m.free(a)
    assert m.get_computed_blocks(Req("b", [1, 2, 3, 4, 5])) == ([[]], 0)


def test_caching_off_never_hits():
    m = KVCacheManager(num_blocks=6, block_size=2, enable_caching=False)
    a = Req("a", [1, 2, 3])
    m.allocate_slots(a, 3)
    m.cache_blocks(a, 3)
    assert m.get_computed_blocks(Req("b", [1, 2, 3])) == ([[]], 0)
    assert m.block_pool.cached_block_hash_to_block == {}


OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "grow", "free"]), st.integers(0, 5), st.integers(1, 12)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(OPS, st.sampled_from([1, 2, 4]), st.booleans())
def test_random_interleavings_never_leak_or_double_free(ops, block_size, caching):
    m = KVCacheManager(num_blocks=12, block_size=block_size, enable_caching=caching)
    pool = m.block_pool
    live: dict[int, Req] = {}
    for op, slot, n in ops:
        if op == "alloc" and slot not in live:
            # Shared prefixes: token values repeat across slots.
            r = Req(f"r{slot}-{len(ops)}", [t % 3 for t in range(n)])
            hits, num_hit = m.get_computed_blocks(r)
            if m.allocate_slots(r, n - num_hit, hits) is not None:
                r.num_computed_tokens = n
                m.cache_blocks(r, n)
                live[slot] = r
        elif op == "grow" and slot in live:
            r = live[slot]
            if m.allocate_slots(r, 1) is not None:
                r.extra.append(slot)
                r.num_computed_tokens += 1
                m.cache_blocks(r, r.num_computed_tokens)
        elif op == "free" and slot in live:
            m.free(live.pop(slot))
        # Invariants: ref counts equal table membership; free queue holds exactly ref 0 blocks.
        held: dict[int, int] = {}
        for r in live.values():
            for bid in m.get_block_ids(r):
                held[bid] = held.get(bid, 0) + 1
        for block in pool.blocks[1:]:
            assert block.ref_cnt == held.get(block.block_id, 0)
        free = free_ids(pool)
        assert len(free) == len(set(free)) == pool.num_free_blocks
        assert set(free) == {b.block_id for b in pool.blocks[1:] if b.ref_cnt == 0}
        assert 0 not in free
        assert pool.num_cached_free_blocks == sum(
            1 for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is not None
        )
    for r in live.values():
        m.free(r)
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert all(b.ref_cnt == 0 for b in pool.blocks)
