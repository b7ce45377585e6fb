"""The cap on prompt tokens beside decoding streams: exact arithmetic on given step times."""

import pytest

from mlx_paged.engine.mixed_step_cap import (
    ALIGN_TOKENS,
    FIRST_TOKENS,
    MIXED_STEPS_KEPT,
    MixedStepCap,
)


def test_the_ratio_must_exceed_one():
    with pytest.raises(ValueError, match="must exceed 1"):
        MixedStepCap(1.0)


def test_explores_from_the_first_size_by_halving_or_doubling_the_last_step():
    cap = MixedStepCap(3.0)
    assert cap.budget == FIRST_TOKENS
    cap.observe_mixed(256, 0.010)  # no decode step known yet: twice the last size
    assert cap.fit() is None and cap.budget == 512
    cap.mixed_steps.clear()
    cap.observe_decode(0.004)
    cap.observe_mixed(300, 0.011)  # kept to 12 ms: twice, in 64s
    assert cap.budget == 576
    cap.observe_mixed(300, 0.013)  # overran it: half; two equal sizes tell nothing apart
    assert cap.fit() is None and cap.budget == 128
    cap.mixed_steps.clear()
    cap.observe_mixed(3, 0.020)  # three rows' last tokens: explored from the first size
    assert cap.fit() is None and cap.budget == 128


def test_steps_all_of_one_size_are_halved_until_the_parts_can_be_told_apart():
    cap = MixedStepCap(3.0)
    for _ in range(3):
        cap.observe_decode(0.003)
    for _ in range(5):  # 8 prompts of 512 tokens a step: the same size every time
        cap.observe_mixed(4096, 0.030)
    assert cap.fit() is None and cap.budget == 2048
    cap.observe_mixed(2048, 0.0165)  # 3 ms fixed, 13.5 ms for 2,048 tokens
    fixed, per_token = cap.fit()
    assert fixed == pytest.approx(0.003) and per_token == pytest.approx(0.0135 / 2048)
    assert cap.budget == 896  # 9 ms - 3 ms: 910 tokens, in 64s


def test_one_slow_step_does_not_tilt_the_fit():
    cap = MixedStepCap(4.0)
    cap.observe_decode(0.004)
    for n in (256, 512, 1024, 256, 512, 1024):
        cap.observe_mixed(n, 0.006 + n * 1e-5)
    cap.observe_mixed(512, 1.3)  # this step met a new graph
    fixed, per_token = cap.fit()
    assert fixed == pytest.approx(0.006) and per_token == pytest.approx(1e-5)


def test_fits_the_target_from_a_fixed_and_a_per_token_part():
    cap = MixedStepCap(4.0)
    for _ in range(3):
        cap.observe_decode(0.004)
    cap.observe_mixed(256, 0.006 + 256e-5)  # 6 ms fixed, 10 us a prompt token
    cap.observe_mixed(1024, 0.006 + 1024e-5)
    fixed, per_token = cap.fit()
    assert fixed == pytest.approx(0.006) and per_token == pytest.approx(1e-5)
    # 4 decode steps are 16 ms: 10 ms for prompt tokens, 1,000, cut to a multiple of 64.
    assert cap.budget == 960


def test_a_fixed_part_near_the_target_still_leaves_prompts_a_third_of_the_step():
    cap = MixedStepCap(2.0)
    cap.observe_decode(0.004)
    cap.observe_mixed(100, 0.009 + 100e-5)  # 9 ms fixed: above the 8 ms target alone
    cap.observe_mixed(400, 0.009 + 400e-5)
    assert cap.budget == 448  # 4.5 ms of prompt work: 450 tokens, in 64s


def test_without_a_decode_step_the_fixed_part_stands_for_one():
    cap = MixedStepCap(3.0)
    cap.observe_mixed(64, 0.002 + 64e-6)  # 2 ms fixed, 1 us a token
    cap.observe_mixed(512, 0.002 + 512e-6)
    assert cap.budget == 3968  # 6 ms - 2 ms: 4,000 tokens, in 64s


def test_noise_keeps_the_last_good_fit_and_the_floor_is_one_alignment():
    cap = MixedStepCap(2.0)
    cap.observe_decode(0.001)
    cap.observe_mixed(150, 0.015)
    cap.observe_mixed(300, 0.030)  # 0.1 ms a token, no fixed part
    assert cap.fit() == pytest.approx((0.0, 1e-4))
    cap.observe_mixed(600, 0.001)  # a slope below zero now: the fit before it stays
    assert cap.fit() == pytest.approx((0.0, 1e-4))
    assert cap.budget == ALIGN_TOKENS  # 2 ms of prompt work: 20 tokens, raised to 64


def test_steps_all_of_one_size_keep_the_slope_and_move_the_fixed_part():
    """The cap makes its steps one size: once the steps that fitted the slope are gone, the
    fixed part still follows what steps of that size cost now."""
    cap = MixedStepCap(3.0)
    cap.observe_decode(0.004)
    cap.observe_mixed(256, 0.008 + 256e-5)  # dear steps (8 ms fixed) set the slope
    cap.observe_mixed(384, 0.008 + 384e-5)
    assert cap.fit() == pytest.approx((0.008, 1e-5)) and cap.budget == 384  # 4 ms: 400
    for _ in range(MIXED_STEPS_KEPT):  # then steps of one size (no pair), 3 ms cheaper
        cap.observe_mixed(320, 0.005 + 320e-5)
    assert cap.fit() == pytest.approx((0.005, 1e-5))
    assert cap.budget == 640  # 12 ms - 5 ms: 700 tokens, in 64s


def test_a_slope_settled_too_steep_is_lifted_by_probes():
    """A first step of a new size that took 23 ms left the fit near 90 us a token where the
    device needs 5: the cap then held every step to its floor, and steps of one size make no
    pair. Steps that keep to the target probe half again their size until a pair corrects it."""

    def cost(tokens):  # 4 ms fixed, 5 us a prompt token
        return 0.004 + 5e-6 * tokens

    cap = MixedStepCap(3.0)
    for _ in range(3):
        cap.observe_decode(0.0033)  # the target: 9.9 ms
    cap.observe_mixed(257, 0.023)  # met a new graph
    cap.observe_mixed(64, 0.006)
    assert cap.fit()[1] == pytest.approx(17e-3 / 193) and cap.budget == ALIGN_TOKENS
    for _ in range(MIXED_STEPS_KEPT + 12):
        tokens = cap.budget
        cap.observe_mixed(tokens, cost(tokens))
    assert cap.fit() == pytest.approx((0.004, 5e-6))
    assert cap.budget == 1152  # 5.9 ms of prompt work: 1,180 tokens, in 64s


def test_no_probe_after_a_step_that_overran_the_target():
    cap = MixedStepCap(3.0)
    cap.observe_decode(0.001)  # the target: 3 ms
    cap.observe_mixed(256, 0.004 + 256e-5)
    cap.observe_mixed(512, 0.004 + 512e-5)  # fixed 4 ms: over the target alone
    for _ in range(MIXED_STEPS_KEPT):
        cap.observe_mixed(192, 0.004 + 192e-5)  # one size, each over the target
    assert cap.budget == 192  # a third of the step (fixed / 2 per token: 200), no probe
