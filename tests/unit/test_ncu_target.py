"""`bench/ncu_target.py` runs its calls (the SDPA peer here) and refuses a kernel it cannot run
with the kernels' own error."""

from __future__ import annotations

import pytest

from mlx_paged.bench import ncu_target
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError


def test_the_sdpa_peer_runs_on_a_small_pool():
    ncu_target.main(["2", "64", "sdpa"], pool_bytes=1 << 22)


@pytest.mark.parametrize("kernel", ["-", "decode_tc_splitk"])
def test_kernels_need_a_gpu_and_say_so(kernel):
    with pytest.raises(UnsupportedSpecError, match="Metal or CUDA"):
        ncu_target.main(["2", "64", kernel], pool_bytes=1 << 22)
