"""The decode batch's persistent block tables: exact ids, slots and padding."""

from types import SimpleNamespace

import numpy as np

from mlx_paged.kv.shape_buckets import bucket, fine_bucket
from mlx_paged.runner.block_table import BlockTable


def _blocks(*ids):
    return [SimpleNamespace(block_id=i) for i in ids]


def test_bucket_pads_to_powers_of_two_above_a_minimum():
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9, 64, 65)] == [1, 2, 4, 8, 8, 16, 64, 128]
    assert bucket(3, minimum=8) == 8 and bucket(0) == 1


def test_fine_bucket_pads_to_four_sizes_an_octave():
    sizes = [fine_bucket(n) for n in (5, 8, 9, 300, 513, 1024, 4097)]
    assert sizes == [5, 8, 10, 320, 640, 1024, 5120]
    assert fine_bucket(3, minimum=256) == 256 and fine_bucket(300, per_octave=2) == 384


def test_rows_gain_blocks_in_place_and_give_tables_lengths_and_slots():
    table = BlockTable(block_size=4)
    a, b = _blocks(7, 3), _blocks(5)
    table.add_row(a)
    table.add_row(b)
    assert table.sync() == 2
    a.append(SimpleNamespace(block_id=9))  # the manager appends as the row grows
    assert table.sync() == 3
    tables, lens, slots = table.decode_inputs(np.array([9, 2], np.int32), num_rows=2, width=3)
    assert tables.tolist() == [[7, 3, 9], [5, 0, 0]]
    assert lens.tolist() == [9, 2]
    # Position 8 is slot 0 of the third block (9); position 1 is slot 1 of block 5.
    assert slots.tolist() == [9 * 4 + 0, 5 * 4 + 1]


def test_padding_rows_are_length_one_on_the_null_block():
    table = BlockTable(block_size=4)
    table.add_row(_blocks(2, 6))
    table.sync()
    tables, lens, slots = table.decode_inputs(np.array([6], np.int32), num_rows=4, width=4)
    assert tables.tolist() == [[2, 6, 0, 0]] + [[0, 0, 0, 0]] * 3
    assert lens.tolist() == [6, 1, 1, 1]
    assert slots.tolist() == [6 * 4 + 1, 0, 0, 0]


def test_keep_rows_moves_rows_and_clears_the_ones_left_behind():
    table = BlockTable(block_size=2)
    for ids in ((1,), (2, 3), (4, 5, 6)):
        table.add_row(_blocks(*ids))
    table.sync()
    table.keep_rows([2, 0])
    assert table.num_rows == 2
    assert table.table[:3, :3].tolist() == [[4, 5, 6], [1, 0, 0], [0, 0, 0]]
    assert table.num_pages == [3, 1]
    table.clear()
    assert table.num_rows == 0 and not table.table.any()


def test_tables_grow_past_their_first_rows_and_blocks():
    table = BlockTable(block_size=1)
    rows = [_blocks(*range(1, 100)) for _ in range(20)]
    for blocks in rows:
        table.add_row(blocks)
    assert table.sync() == 99
    lens = np.full(20, 99, np.int32)
    tables, _, slots = table.decode_inputs(lens, num_rows=32, width=128)
    assert tables.shape == (32, 128)
    assert tables[19, :99].tolist() == list(range(1, 100)) and slots[:20].tolist() == [99] * 20
