"""Soft-capped (gemma2) and chunked (llama4) scores: which kernels take them, and where the
routing sends them."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_routing import route, routed_specs


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (dict(kernel="decode_simt", sliding_window=True, chunked=True), "two masks"),
        (dict(kernel="decode_tc", softcap=True), "compute plain scores"),
        (dict(kernel="decode_simt", rope=True, chunked=True), "compute plain scores"),
        (dict(kernel="decode_reduce", partition_size=512, softcap=True), "no scores to cap"),
    ],
)
def test_score_rules_are_refused_where_no_kernel_computes_them(fields, reason):
    with pytest.raises(UnsupportedSpecError, match=reason):
        KernelSpec(backend="cuda", dtype="bfloat16", head_dim=128, **fields)


def test_soft_capped_or_chunked_scores_route_to_the_simt_kernels():
    for rules in (dict(softcap=True), dict(chunked=True)):
        specs = routed_specs("cuda", mx.bfloat16, 128, 16, 4, False, **rules)
        assert {s.kernel for s in specs} == {"decode_simt", "decode_simt_splitk", "decode_reduce"}
        reduce = next(s for s in specs if s.is_reduce)
        assert not reduce.softcap and reduce.chunked == rules.get("chunked", False)
    assert route("cuda", mx.bfloat16, 128, 16, 8, 4096, plain_scores=False).kernel.startswith(
        "decode_simt"
    )
