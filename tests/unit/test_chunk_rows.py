"""What chunk tokens riding as decode rows read and how many rows a mixed step has: exact."""

from types import SimpleNamespace

import pytest

from mlx_paged.runner.chunk_rows import (
    MIXED_STEP_MIN_ROWS,
    chunk_row_reads,
    mixed_step_rows,
    row_reads,
    tokens_within_reads,
)


def _chunk(computed: int, tokens: int):
    """A request with `computed` tokens after this step's chunk of `tokens`."""
    return SimpleNamespace(num_computed_tokens=computed), tokens


def test_a_chunk_token_reads_its_context_up_to_itself():
    assert chunk_row_reads([_chunk(3, 3)]) == 1 + 2 + 3  # a chunk from position 0
    assert chunk_row_reads([_chunk(12, 2)]) == 11 + 12  # two tokens after ten
    assert chunk_row_reads([_chunk(512, 512), _chunk(3, 3)]) == 512 * 513 // 2 + 6


def test_mixed_step_rows_pad_decode_rows_then_bucket_where_asked():
    assert mixed_step_rows(5, 100, bucketed=False) == 8 + 100  # decode rows to their bucket
    assert mixed_step_rows(5, 100, bucketed=True) == MIXED_STEP_MIN_ROWS
    assert mixed_step_rows(64, 449, bucketed=True) == 640  # 513: four sizes an octave
    assert mixed_step_rows(64, 4096, bucketed=True) == 5120


@pytest.mark.parametrize("start", [0, 1, 511, 1024, 30000])
def test_tokens_within_reads_is_the_most_that_fit(start):
    for reads in (0, start, row_reads(start, 100), row_reads(start, 100) - 1, 1 << 18):
        n = tokens_within_reads(start, reads)
        assert row_reads(start, n) <= reads < row_reads(start, n + 1)
    assert tokens_within_reads(0, 1 << 18) == 723 and tokens_within_reads(1024, 1 << 18) == 230
