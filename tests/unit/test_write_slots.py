"""Pool slots of a chunk's positions (`slots_of`), as numpy arithmetic over its blocks."""

import pytest

from mlx_paged.runner.group_metadata import slots_of


@pytest.mark.parametrize("start,count", [(0, 1), (0, 16), (5, 27), (15, 2), (31, 1), (3, 0)])
def test_each_position_lands_in_its_block_at_its_offset(start, count):
    table, block_size = [7, 2, 9, 4], 8
    expected = [table[p // block_size] * block_size + p % block_size
                for p in range(start, start + count)]  # fmt: skip
    assert slots_of(table, start, count, block_size).tolist() == expected
