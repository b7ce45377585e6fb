"""State-slot bookkeeping of hybrid models: slots per request, snapshots evicted least recently
used first when requests need slots, and the fills owed to the pool, in order."""

from __future__ import annotations

import pytest

from mlx_paged.kv.state_slots import StateSlots


def test_requests_take_free_slots_and_give_them_back():
    slots = StateSlots(3)
    assert slots.allocate("a") == 1 and slots.allocate("b") == 2
    assert slots.num_available == 0 and slots.num_in_use == 2
    assert slots.take_pending() == [(1, None), (2, None)]  # fresh slots start from zeros
    slots.free_slot("a")
    assert slots.num_available == 1 and slots.allocate("c") == 1


def test_a_request_restores_from_a_snapshot_copied_into_its_own_slot():
    slots = StateSlots(4)
    slots.allocate("a")
    assert slots.save_snapshot("h1") == 2
    assert slots.save_snapshot("h1") is None  # kept already
    assert slots.allocate("b", restore="h1") == 3
    assert slots.take_pending() == [(1, None), (3, 2)]
    assert slots.has_snapshot("h1")


def test_snapshots_give_way_to_requests_least_recently_used_first():
    slots = StateSlots(4)
    assert (slots.save_snapshot("old"), slots.save_snapshot("new")) == (1, 2)
    slots.allocate("a")  # slot 3, the last free one
    assert slots.allocate("b") == 1 and not slots.has_snapshot("old")
    assert slots.num_available == 1  # "new" can still give way


def test_the_last_snapshot_becomes_the_state_of_the_request_restoring_it():
    slots = StateSlots(2)
    assert slots.save_snapshot("h") == 1
    assert slots.allocate("a", restore="h") == 1
    assert slots.take_pending() == []  # its state is the snapshot: nothing to copy
    assert not slots.has_snapshot("h")


def test_a_slot_freed_before_its_fill_owes_nothing():
    slots = StateSlots(3)
    slots.allocate("a")
    slots.free_slot("a")
    assert slots.take_pending() == []


def test_no_snapshots_without_caching_and_no_slot_when_all_are_running():
    slots = StateSlots(2, enable_caching=False)
    assert slots.save_snapshot("h") is None
    slots.allocate("a")
    with pytest.raises(ValueError, match="no state slot is free"):
        slots.allocate("b")
    with pytest.raises(RuntimeError, match="already holds"):
        slots.allocate("a")


def test_reset_forgets_snapshots_and_frees_their_slots():
    slots = StateSlots(3)
    slots.save_snapshot("h")
    slots.reset_snapshots()
    assert not slots.has_snapshot("h") and len(slots.free) == 2


def test_state_slots_take_at_most_half_the_budget_and_the_pages_the_rest():
    from mlx_paged.runner.paged_setup import _pool_sizes

    # 1000-byte blocks, 3000-byte states, 41 slots wanted (20 live requests, 20 snapshots).
    assert _pool_sizes(1000, 16, 300_000, None, None, 3000, 41) == (180, 41)  # all fit in half
    # 20_000 bytes: half holds 3 states, so 4 slots with the unused slot 0; pages get 11_000.
    assert _pool_sizes(1000, 16, 20_000, None, None, 3000, 41) == (11, 4)
    with pytest.raises(ValueError, match="holds no recurrent-state slot"):
        _pool_sizes(1000, 16, 5_000, None, None, 3000, 41)
    # Blocks given: the slots wanted come on top; attention-only models want none.
    assert _pool_sizes(1000, 16, None, 50, None, 3000, 41) == (50, 41)
    assert _pool_sizes(1000, 16, 20_000, None, None) == (20, 0)


def test_hybrid_chunks_cut_at_shared_offsets_and_snapshot_points():
    from types import SimpleNamespace

    from mlx_paged.runner.hybrid_states import prefill_segments

    def req(name, prompt, computed):
        return SimpleNamespace(name=name, num_prefill_tokens=prompt, num_computed_tokens=computed)

    # Prompts of 19 and 40 tokens in blocks of 4: snapshots at 12, 16 and 32, 36.
    a, b, c = req("a", 19, 18), req("b", 40, 39), req("c", 3, 2)
    groups = [
        [(s.request.name, s.start, s.end, s.snapshot) for s in group]
        for group in prefill_segments([(a, 18), (b, 39), (c, 2)], 4)
    ]
    # Every chunk is cut at the union of the offsets: the step costs its longest chunk.
    assert groups == [
        [("a", 0, 2, False), ("b", 0, 2, False), ("c", 0, 2, False)],
        [("a", 2, 12, True), ("b", 2, 12, False)],
        [("a", 12, 16, True), ("b", 12, 16, False)],
        [("a", 16, 18, False), ("b", 16, 18, False)],
        [("b", 18, 32, True)],
        [("b", 32, 36, True)],
        [("b", 36, 39, False)],
    ]
    # Chunks continuing from other positions line up from their own starts.
    d, e = req("d", 40, 20), req("e", 40, 34)
    groups = [
        [(s.request.name, s.start, s.end, s.snapshot) for s in group]
        for group in prefill_segments([(d, 10), (e, 10)], 4)
    ]
    assert groups == [
        [("d", 10, 18, False), ("e", 24, 32, True)],
        [("d", 18, 20, False), ("e", 32, 34, False)],
    ]
