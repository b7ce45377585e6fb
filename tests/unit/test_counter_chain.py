"""The fused kernel's counter chain: zeros to start, then each call's `counters_next`."""

import mlx.core as mx

from mlx_paged.kernels.counter_chain import CounterChain


def _launch(seen, marker):
    """A stand-in for the kernel call: records the counters it got, returns an output and a
    `counters_next` shaped like them (filled with `marker` so the test can tell them apart)."""

    def launch(counters):
        seen.append(counters)
        return [mx.array([marker]), mx.full(counters.shape, marker, dtype=mx.int32)]

    return launch


def test_first_call_gets_zeros_then_each_call_the_previous_counters_next():
    chain, seen = CounterChain(), []
    assert chain.size() == 0
    first = chain.call(8, _launch(seen, 1))
    assert seen[0].shape == (256,) and seen[0].dtype == mx.int32
    assert mx.array_equal(seen[0], mx.zeros((256,), dtype=mx.int32)).item()
    second = chain.call(16, _launch(seen, 2))
    assert seen[1] is first[-1]
    chain.call(256, _launch(seen, 3))
    assert seen[2] is second[-1]
    assert chain.size() == 256


def test_more_groups_than_slots_start_a_larger_chain_of_zeros():
    chain, seen = CounterChain(), []
    chain.call(8, _launch(seen, 1))
    chain.call(257, _launch(seen, 2))
    assert seen[1].shape == (512,)
    assert mx.array_equal(seen[1], mx.zeros((512,), dtype=mx.int32)).item()
    chain.call(3000, _launch(seen, 3))
    assert seen[2].shape == (3000,)
    assert chain.size() == 3000


def test_reserve_grows_and_replace_hands_in_a_traced_steps_counters():
    chain, seen = CounterChain(), []
    reserved = chain.reserve(300)
    assert reserved.shape == (300,)
    assert chain.reserve(10) is reserved  # big enough: the same counters
    traced_next = mx.full((300,), 7, dtype=mx.int32)
    chain.replace(traced_next)
    chain.call(8, _launch(seen, 1))
    assert seen[0] is traced_next
