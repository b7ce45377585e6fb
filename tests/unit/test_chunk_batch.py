"""Chunks laid out for one attention call: exact index arithmetic."""

import numpy as np

from mlx_paged.kv.chunk_batch import chunk_batch


def test_one_chunk_keeps_its_own_call():
    assert chunk_batch([(0, 5, [3, 4])]) is None


def test_rows_padded_to_the_longest_chunk_and_picked_back_in_order():
    # Two chunks: 3 tokens from position 4 (pages 7, 8), then 1 token from 0 (page 9).
    batch = chunk_batch([(4, 3, [7, 8]), (0, 1, [9])])
    assert batch.shape == (2, 3)
    assert np.array(batch.tables).tolist() == [[7, 8], [9, 0]]
    assert np.array(batch.context_lens).tolist() == [7, 1]
    assert np.array(batch.positions).tolist() == [[4, 5, 6], [0, 1, 2]]
    # Chunk tokens 0-2 are the first chunk's, 3 the second's; padding repeats a chunk's last.
    assert np.array(batch.query_rows).tolist() == [0, 1, 2, 3, 3, 3]
    assert np.array(batch.token_rows).tolist() == [0, 1, 2, 3]
