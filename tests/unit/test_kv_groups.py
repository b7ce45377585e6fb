"""KV cache groups: how layers are grouped, and a window group's blocks: freed once no query
can see them, still cached for prefix hits that need them."""

from __future__ import annotations

from test_block_manager import Req, free_ids

from mlx_paged.kv.kv_cache_manager import KVCacheManager
from mlx_paged.kv.kv_groups import KVCacheGroups, plan_groups


def test_gemma3_like_layers_group_by_window_and_share_arrays_place_by_place():
    windows = ([512] * 5 + [None]) * 2  # 10 window layers, 2 full ones
    groups, why = plan_groups(windows, [(8, 128, 16, 128)] * 12)
    assert why is None
    assert groups.windows == (None, 512, 512, 512, 512, 512)
    assert groups.layer_group == (1, 1, 2, 2, 3, 0, 3, 4, 4, 5, 5, 0)
    assert groups.layer_array == (0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1)
    assert groups.num_arrays == 2 and groups.array_layers == [0, 1]
    assert groups.page_scale == () and groups.scales == (1,) * 6


def test_gemma4_like_global_layers_hold_twice_the_tokens_a_block():
    """Global layers of half the window layers' K/V bytes a token share their arrays: their
    group's block b is pages 2b and 2b + 1 of a view with twice the pages (32 tokens a block
    of 16-token pages); the arrays take the window layers' shape."""
    sliding, wide = (8, 128, 16, 128), (2, 256, 16, 256)
    groups, why = plan_groups(([512] * 5 + [None]) * 2, ([sliding] * 5 + [wide]) * 2)
    assert why is None
    assert groups.layer_array == (0, 1, 0, 1, 0, 0, 1, 0, 1, 0, 1, 1)
    assert groups.scales == (2, 1, 1, 1, 1, 1)
    assert groups.array_layers == [0, 1]
    # V heads of half the K heads' size scale alike (mimo_v2_flash's shapes).
    groups, why = plan_groups([8, None], [(1, 32, 4, 16), (2, 32, 4, 16)])
    assert why is None and groups.scales == (1, 2) and groups.array_layers == [1]


def test_one_group_without_windows_or_where_shapes_do_not_divide():
    assert plan_groups([None, None], [(2, 64, 4, 64)] * 2) == (KVCacheGroups.single(2), None)
    for other in ((3, 64, 4, 64), (2, 64, 4, 32), (6, 64, 4, 64)):
        groups, why = plan_groups([512, None], [(2, 64, 4, 64), other])
        assert groups == KVCacheGroups.single(2) and "do not divide" in why, other
    # Two full layers, so two window layers a group: they must share a shape.
    a, b = (2, 64, 4, 64), (1, 64, 4, 64)
    groups, why = plan_groups([512, 512, None, None], [a, b, a, a])
    assert groups == KVCacheGroups.single(4) and "several shapes" in why


def _decode(m: KVCacheManager, r: Req, token: int) -> None:
    assert m.allocate_decode(r)
    r.num_computed_tokens += 1
    r.extra.append(token)


def test_a_window_group_frees_what_its_window_left_and_keeps_it_cached():
    m = KVCacheManager(num_blocks=24, block_size=4, group_windows=(None, 8))
    a = Req("a", list(range(10)))
    assert [b.block_id for b in m.allocate_slots(a, 10)] == [1, 2, 3, 4, 5, 6]
    a.num_computed_tokens = 10
    m.cache_blocks(a, 10)
    # A query at 10 sees positions 3..10: the window group still needs its block 0.
    assert m.get_block_ids(a, 0) == [1, 2, 3] and m.get_block_ids(a, 1) == [4, 5, 6]
    for token in range(10, 20):
        _decode(m, a, token)
    # Blocks go at block boundaries: at 12 tokens block 0 (positions 0..3, out of the window
    # of a query at 11 or later), at 16 block 1. They keep their hashes, at the queue's end.
    assert m.get_block_ids(a, 0) == [1, 2, 3, 7, 9]
    assert m.get_block_ids(a, 1) == [0, 0, 6, 8, 10]
    assert free_ids(m.block_pool)[-2:] == [4, 5]
    m.free(a, cache_computed=True)

    # A prompt sharing 16 tokens hits every full block, and in the window group only the
    # blocks a query at 16 sees (9..16: blocks 2 and 3), which are still cached.
    b = Req("b", list(range(16)) + [99])
    hits, n = m.get_computed_blocks(b)
    assert n == 16
    assert [h.block_id for h in hits[0]] == [1, 2, 3, 7]
    assert [h.block_id for h in hits[1]] == [0, 0, 6, 8]
    assert m.allocate_slots(b, 1, hits) is not None
    assert m.get_block_ids(b, 1) == [0, 0, 6, 8, 12]  # 11 went to the full group


def test_a_window_group_hit_needs_its_window_blocks():
    m = KVCacheManager(num_blocks=24, block_size=4, group_windows=(None, 8))
    a = Req("a", list(range(17)))
    m.allocate_slots(a, 17)
    a.num_computed_tokens = 17
    m.cache_blocks(a, 17)
    m.free(a)
    assert m.get_computed_blocks(Req("b", list(range(17))))[1] == 16
    # Without the window group's block 3 (evicted), no hit can end at 16; one ending at 12
    # needs blocks 1 and 2 (a query at 12 sees 5..12), which are there.
    hashes = m._block_hashes(Req("b", list(range(17))))
    m.block_pool._evict(m.block_pool.get_cached_block((1, hashes[3])))  # as reuse would
    assert m.get_computed_blocks(Req("c", list(range(17))))[1] == 12


def test_a_prompt_takes_window_blocks_chunk_by_chunk():
    m = KVCacheManager(num_blocks=12, block_size=4, group_windows=(None, 8))
    a = Req("a", list(range(20)))
    # Admission: the full group holds the whole prompt, the window group nothing yet.
    assert [b.block_id for b in m.allocate_slots(a, 20, window_tokens=0)] == [1, 2, 3, 4, 5]
    assert m.get_block_ids(a, 1) == []
    assert m.allocate_chunk(a, 8) and m.get_block_ids(a, 1) == [6, 7]
    a.num_computed_tokens = 8
    assert m.allocate_chunk(a, 8) and m.get_block_ids(a, 1) == [6, 7, 8, 9]
    a.num_computed_tokens = 16
    # A query at 16 sees 9..16: blocks 0 and 1 go back (to the queue's end) before block 4 is
    # taken from its front.
    assert m.allocate_chunk(a, 3) and m.get_block_ids(a, 1) == [0, 0, 8, 9, 10]
    # A chunk the pool cannot hold takes nothing.
    b = Req("b", list(range(100, 104)))
    assert m.allocate_slots(b, 4, window_tokens=0) is not None
    assert m.block_pool.num_free_blocks == 2
    assert not m.allocate_chunk(b, 4 * 3) and m.get_block_ids(b, 1) == []


def test_groups_of_several_pages_a_block_hit_where_every_group_s_blocks_end():
    """The full group's blocks hold 2 pages of 4 tokens (Gemma 4's global layers), the window
    group's 1: each allocates, caches and frees in its own blocks, and a prefix hit ends on
    8-token boundaries."""
    m = KVCacheManager(num_blocks=32, block_size=4, group_windows=(None, 8), group_scales=(2, 1))
    a = Req("a", list(range(10)))
    assert [b.block_id for b in m.allocate_slots(a, 10)] == [1, 2, 3, 4, 5]
    a.num_computed_tokens = 10
    m.cache_blocks(a, 10)
    assert m.get_block_ids(a, 0) == [1, 2] and m.get_block_ids(a, 1) == [3, 4, 5]
    assert m.num_cached_block["a"] == [1, 2]  # 8 and 8 of the 10 tokens
    for token in range(10, 20):
        _decode(m, a, token)
    assert m.get_block_ids(a, 0) == [1, 2, 7] and m.get_block_ids(a, 1) == [0, 0, 5, 6, 8]
    m.free(a, cache_computed=True)
    # 16 tokens hit: 2 full-group blocks, and the window group's pages 2 and 3 (9..16).
    hits, n = m.get_computed_blocks(Req("b", list(range(19)) + [99]))
    assert n == 16 and [[h.block_id for h in g] for g in hits] == [[1, 2], [0, 0, 5, 6]]
    # 13 tokens to look up: 12 are whole pages, but the full group's blocks end at 8.
    hits, n = m.get_computed_blocks(Req("c", list(range(13)) + [99]))
    assert n == 8 and [[h.block_id for h in g] for g in hits] == [[1], [3, 4]]
