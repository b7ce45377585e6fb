"""`bench/ncu_target.py` runs its calls (the SDPA peer here) and refuses a kernel it cannot run
with the kernels' own error."""

from __future__ import annotations

import pytest

from mlx_paged.bench import ncu_target
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError


def test_the_sdpa_peer_runs_on_a_small_pool():
    ncu_target.main(["2", "64", "sdpa"], pool_bytes=1 << 22)


@pytest.mark.parametrize(
    "argv",
    [
        ["-"],
        ["decode_tc_splitk"],
        ["-", "-", "4/32"],
        ["decode_tc_splitk", "1024", "8/64"],
        ["latent16"],
        ["latent16", "64"],
    ],
)
def test_kernels_need_a_gpu_and_say_so(argv):
    with pytest.raises(UnsupportedSpecError, match="Metal or CUDA"):
        ncu_target.main(["2", "64", *argv], pool_bytes=1 << 22)


def test_quantized_pages_are_for_the_decode_kernels():
    with pytest.raises(ValueError, match="sdpa reads 16-bit K/V"):
        ncu_target.main(["2", "64", "sdpa", "-", "4/32"], pool_bytes=1 << 22)
