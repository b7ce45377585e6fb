"""The paged decode kernels the product routes: what each one does, as the templates read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kernel:
    """What one decode kernel does, as the templates read it.

    Attributes:
        name: the kernel's name, the first part of its specs' names.
        tensor_cores: scores and P.V on `mma.sync` (CUDA, bf16/fp16, 16-token sub-pages).
        stages: slots of the per-simdgroup shared-memory ring K/V pass through (cp.async);
            0 loads them straight into registers.
        unroll: 16-token sub-pages loaded into registers per step (tensor cores, no ring).
        simdgroups: per threadgroup; 0 is 4, halved while the merge buffer passes 32 KB.
        split: "none" (one pass over the whole sequence), "two_pass" (fp32 partials per
            partition, merged by `decode_reduce`), "fused" (the partition that finishes last
            merges, in the same launch; CUDA) or "reduce" (the merge of "two_pass").
        partition_sizes: the tokens per partition it is generated for (split kernels).
    """

    name: str
    tensor_cores: bool = False
    stages: int = 0
    unroll: int = 0
    simdgroups: int = 0
    split: str = "none"
    partition_sizes: tuple[int, ...] = ()


KERNELS = {
    k.name: k
    for k in (
        Kernel("decode_simt"),
        Kernel("decode_simt_splitk", split="two_pass", partition_sizes=(512,)),
        Kernel("decode_reduce", split="reduce", partition_sizes=(512,)),
        Kernel("decode_tc", tensor_cores=True, stages=3),
        Kernel("decode_tc_wide", tensor_cores=True, stages=3, simdgroups=8),
        Kernel(
            "decode_tc_splitk", tensor_cores=True, stages=3, split="fused", partition_sizes=(1024,)
        ),
        Kernel(
            "decode_tc_splitk_direct",
            tensor_cores=True,
            unroll=2,
            split="fused",
            partition_sizes=(1024, 2048, 4096),
        ),
    )
}
