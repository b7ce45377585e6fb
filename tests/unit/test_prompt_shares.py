"""Splitting a paced step's prompt budget: exact arithmetic."""

from mlx_paged.engine.prompt_shares import shared_grants


def test_equal_shares_first_then_what_is_left_in_arrival_order():
    # Shares of 100: the short prompt needs 10, and the first long one takes what is left.
    assert shared_grants([1000, 10, 1000], 300, 1) == [190, 10, 100]


def test_larger_shares_mean_fewer_chunks_yet_a_short_prompt_still_goes_whole():
    # One share of at least 200 fits beside the short prompt, which goes whole first.
    assert shared_grants([1000, 10, 1000], 300, 200) == [290, 10, 0]
    assert shared_grants([1000] * 4, 640, 256) == [320, 320, 0, 0]
    assert shared_grants([50, 50], 300, 256) == [50, 50]


def test_a_budget_below_one_share_goes_to_the_first_prompt():
    assert shared_grants([1000] * 4, 100, 256) == [100, 0, 0, 0]
