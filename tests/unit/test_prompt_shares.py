"""Splitting a paced step's prompt budget: exact arithmetic."""

from mlx_paged.engine.prompt_shares import aligned_cut, shared_grants, within_row_reads


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


def test_a_chunk_the_budget_cuts_ends_on_an_aligned_position():
    assert aligned_cut(5, 100, 20, 8, first=False) == 19  # ends at 24
    assert aligned_cut(5, 10, 20, 8, first=False) == 10  # fits: not cut
    assert aligned_cut(0, 100, 4, 8, first=False) == 0  # waits for the next step
    assert aligned_cut(0, 100, 4, 8, first=True) == 4  # but the step's first progresses


READS = 1 << 18  # a 511-token chunk from position 0 reads 130,816 context tokens as rows


def whole(*chunks):  # (start, tokens) granted all they want
    return [(start, n, n) for start, n in chunks]


def test_chunks_that_fit_the_row_reads_go_whole_the_next_waits():
    assert within_row_reads(whole(*[(0, 511)] * 3), READS, 16) == [511, 511, 0]
    # A short chunk that fits after one that did not is taken; one that does not, waits.
    assert within_row_reads(whole((0, 723), (0, 600), (0, 20)), READS, 16) == [723, 0, 20]
    assert within_row_reads(whole((0, 723), (0, 600), (0, 30)), READS, 16) == [723, 0, 0]


def test_a_chunk_past_the_reads_is_cut_to_what_fits_where_its_rest_fits_a_step():
    # 723 tokens from 0 read 261,726; the cut ends on a multiple of 16: 720. The rest, 280
    # tokens from 720, reads 240,940: it rides as rows in the next step.
    assert within_row_reads(whole((0, 1000), (0, 511)), READS, 16) == [720, 0]
    # After 511 tokens, 131,328 reads are left: exactly 512 tokens from 0, and the other 88
    # fit a step.
    assert within_row_reads(whole((0, 511), (0, 600)), READS, 16) == [511, 512]
    # Granted 800 of the 900 it wants: cut to 720, the rest is the 180 it wants.
    assert within_row_reads([(0, 800, 900)], READS, 16) == [720]
    # Granted 600 of 900 from 512: cut to 368, 532 would be left, too many for one step.
    assert within_row_reads([(512, 600, 900)], READS, 16) == [600]


def test_a_chunk_whose_rest_would_not_fit_a_step_waits_or_goes_split():
    # The rest of a 1,024-token prompt after 720 reads 265,240: as the first chunk, the step
    # attends its chunks as prefill (the grants stand); behind another, it waits.
    assert within_row_reads(whole((0, 1024), (0, 511)), READS, 16) == [1024, 511]
    assert within_row_reads(whole((0, 511), (0, 1024)), READS, 16) == [511, 0]
    # From 1,024 on, 230 tokens fit (under a share of 256): the grants stand.
    assert within_row_reads(whole((1024, 2048), (0, 511)), READS, 16) == [2048, 511]
    # A first chunk granted fewer than 256 tokens must fit whole to ride as rows.
    assert within_row_reads(whole((4096, 100), (0, 511)), READS, 16) == [100, 511]
