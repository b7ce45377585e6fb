"""The quantized ring's slot row stride: counted shared-memory wavefronts of the lane reads."""

import pytest

from mlx_paged.kernels.quantized_pages import row_layout
from mlx_paged.kernels.quantized_ring_rows import read_wavefronts, slot_row_stride


def test_rows_of_160_bytes_pad_to_176_where_no_v_load_conflicts():
    """Head dim 128, 4 bits, groups of 32: at 160 bytes a K load (2 rows a quarter warp) is
    2-way and a V load (rows 2t, 4 a half warp) 4-way on the banks; at 176 only K is 2-way."""
    layout = row_layout(128, 2, 4, 4, 32)
    # Ideal: 2 K loads of 16 bytes (4 quarter warps) + 4 V loads of 8 bytes (2 half warps).
    ideal = 2 * 4 + 4 * 2
    assert read_wavefronts(layout, 128, 4, 4, 160) == 2 * 8 + 4 * 4
    assert read_wavefronts(layout, 128, 4, 4, 176) == 2 * 8 + 4 * 2
    assert read_wavefronts(layout, 128, 4, 4, 192) == 2 * 4 + 4 * 8
    assert ideal < read_wavefronts(layout, 128, 4, 4, 176)
    assert slot_row_stride(layout, 128, 4, 4) == 176


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("bits", [(4, 4), (8, 8), (8, 4), (4, 8)])
@pytest.mark.parametrize("group", [32, 64])
def test_stride_is_a_padded_row_no_worse_than_the_row_itself(head_dim, bits, group):
    layout = row_layout(head_dim, 2, *bits, group)
    stride = slot_row_stride(layout, head_dim, *bits)
    assert layout.row_bytes <= stride <= layout.row_bytes + 128
    assert stride % layout.alignment == 0
    unpadded = read_wavefronts(layout, head_dim, *bits, layout.row_bytes)
    assert read_wavefronts(layout, head_dim, *bits, stride) <= unpadded
