"""Multi-head latent attention (MLA) decode over latent pages, as generated kernels: pass 1
(`latent_attention.jinja`, SIMT on every backend, the tensor cores on CUDA) and pass 2, the
partition merge the per-head decode kernels use (`paged_attention_reduce.jinja`). The oracle is
`latent_attention_reference`."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from mlx_paged.codegen.build import KernelDefinition, check_definition, compile_kernel
from mlx_paged.codegen.environment import render, render_macro
from mlx_paged.kernels.kernel_inputs import constant
from mlx_paged.kernels.kernel_spec import DTYPE_SHORT, DTYPES, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_routing import dtype_name

TEMPLATES = Path(__file__).resolve().parent
PARTITION = 512  # tokens a threadgroup of pass 1 reads, unless a small grid asks for fewer
PARTITIONS = (2048, 1024, 512, 256, 128, 64)  # the partition lengths built, longest first
# About one wave of a 132-SM GPU at four threadgroups an SM: shorter partitions below it.
FILL_THREADGROUPS = 512
HEADS_PER_THREADGROUP = 16
THREADS = 128
_NAME = re.compile(
    r"latent_(simt|mma|reduce)_([a-z]+)_([a-z0-9]+)_r(\d+)_p(\d+)_bs(\d+)(?:_pt(\d+))?"
)


@dataclass(frozen=True)
class LatentSpec:
    """One MLA decode kernel: `kernel` "simt" or "mma" (pass 1: SIMT math, or CUDA's tensor
    cores) or "reduce" (pass 2), for latent rows of `latent_dim` and RoPE keys of `rope_dim`
    in pages of `block_size` tokens, in `dtype`, pass 1 reading `partition_size` tokens a
    threadgroup."""

    kernel: str
    backend: str
    dtype: str
    latent_dim: int
    rope_dim: int
    block_size: int
    partition_size: int = PARTITION

    def __post_init__(self):
        problems = []
        if self.dtype not in DTYPES:
            problems.append(f"dtype {self.dtype}")
        if (self.latent_dim + self.rope_dim) % 8 or self.latent_dim % 8:
            problems.append(f"latent {self.latent_dim} + RoPE {self.rope_dim} (multiples of 8)")
        if self.block_size % 16:
            problems.append(f"block size {self.block_size} (a multiple of 16)")
        if self.partition_size not in PARTITIONS:
            problems.append(f"partition {self.partition_size} (one of {PARTITIONS})")
        if self.tensor_cores and (
            self.backend != "cuda"
            or self.dtype == "float32"
            or self.latent_dim % 64
            or self.rope_dim % 16  # the score dims go 16 an mma step
        ):
            problems.append("tensor cores (CUDA, 16-bit, latent and RoPE multiples of 64 and 16)")
        if problems:
            raise UnsupportedSpecError(f"no latent-attention kernel for {', '.join(problems)}")

    @property
    def name(self) -> str:
        partition = "" if self.partition_size == PARTITION else f"_pt{self.partition_size}"
        return (
            f"latent_{self.kernel}_{self.backend}_{DTYPE_SHORT[self.dtype]}_r{self.latent_dim}"
            f"_p{self.rope_dim}_bs{self.block_size}{partition}"
        )

    @classmethod
    def parse(cls, name: str) -> LatentSpec:
        """Inverse of `name` (e.g. `latent_mma_cuda_bf16_r512_p64_bs16`, or with `_pt128` for
        partitions of 128 tokens)."""
        match = _NAME.fullmatch(name)
        dtypes = {short: full for full, short in DTYPE_SHORT.items()}
        if match is None or match[3] not in dtypes:
            raise UnsupportedSpecError(f"{name!r} is not a latent-attention kernel name")
        partition = int(match[7]) if match[7] else PARTITION
        return cls(match[1], match[2], dtypes[match[3]], *(int(match[i]) for i in (4, 5, 6)),
                   partition)  # fmt: skip

    # What the shared templates (`_dialect.jinja`, `paged_attention_reduce.jinja`) read.
    @property
    def tensor_cores(self) -> bool:
        return self.kernel == "mma"

    @property
    def stages(self) -> int:
        """Tiles in shared memory: with tensor cores a ring of two (the next tile copies by
        cp.async under this one's math; three timed slower on the H100), else one."""
        return 2 if self.tensor_cores else 1

    @property
    def threads(self) -> int:
        """Threads a threadgroup: pass 1's THREADS; the merge's, four latent dims a thread in
        whole simdgroups, at most four (a latent row of 512 merges in one step, with four
        times a simdgroup's loads in flight)."""
        if self.kernel == "reduce":
            return min(128, -(-self.latent_dim // 4 // 32) * 32)
        return THREADS

    @property
    def min_threadgroups_per_sm(self) -> int | None:
        """Tensor cores: four pass-1 threadgroups an SM (128 registers a thread; the
        compiler's free choice, 164, allows three, which ran 1% slower at 1 GiB on the H100)."""
        return 4 if self.tensor_cores else None

    @property
    def tile_tokens(self) -> int:
        """Tokens a staged tile (the templates take any multiple of 16; at 32 the tensor-core
        form's ring fits two threadgroups an SM, and ran 14% slower on the H200 at 1 GiB)."""
        return 16

    @property
    def score_bytes(self) -> int:
        """The tensor-core form's static shared memory: four warps' fp32 scores, 16 heads x a
        tile's tokens each (`la_scores`)."""
        return 4 * HEADS_PER_THREADGROUP * self.tile_tokens * 4

    quantized = False
    sliding_window = False
    chunked = False

    @property
    def v_dim(self) -> int:
        return self.latent_dim


@functools.cache
def define(spec: LatentSpec) -> KernelDefinition:
    """Pass 1: inputs queries `(B, H, 1, latent + rope)` (the absorbed query and the RoPE part,
    side by side), latent and RoPE pages `[num_blocks, block_size, 1, dim]`, block tables,
    lengths and the scale; outputs each partition's fp32 output `(B, H, P, latent)`, row max
    (base 2, up to 8 below the true one on tensor cores) and row sum `(B, H, P)`, output and
    sum relative to that max. Pass 2 merges them into `out` `(B, H, latent)`."""
    header = render_macro(TEMPLATES, "_dialect.jinja", "cuda_header", spec)
    if spec.kernel == "reduce":
        names = (("partial_out", "partial_max", "partial_sum", "seq_lens"), ("out",))
        template, shared, ring = "paged_attention_reduce.jinja", 0, 0
    else:
        inputs = ("queries", "latent_pages", "rope_pages", "block_tables", "seq_lens", "scale")
        names = (inputs, ("partial_out", "partial_max", "partial_sum"))
        template = "latent_attention.jinja"
        row_bytes = (spec.latent_dim + spec.rope_dim + 8) * getattr(mx, spec.dtype).size
        tile = spec.tile_tokens * row_bytes
        # Tensor cores: a ring of tiles (dynamic) and the four warps' scores (static).
        shared, ring = (spec.score_bytes, spec.stages * tile) if spec.tensor_cores else (tile, 0)
    return check_definition(
        KernelDefinition(
            name=spec.name,
            backend=spec.backend,
            spec=spec,
            source=render(TEMPLATES, template, spec),
            header=header,
            input_names=names[0],
            output_names=names[1],
            threads_per_threadgroup=spec.threads,
            threadgroup_bytes=shared,
            ring_bytes=ring,
        )
    )


@functools.cache
def build(spec: LatentSpec):
    """The `mx.fast` kernel object of `spec`, built once per process."""
    return compile_kernel(define(spec))


def pass_one_kernel(backend: str, dtype: str) -> str:
    """ "mma" on CUDA at 16 bits, else "simt"."""
    return "mma" if backend == "cuda" and dtype != "float32" else "simt"


def spec_for(backend: str, dtype: mx.Dtype, latent_dim: int, rope_dim: int, block_size: int,
             kernel: str | None = None, partition_size: int = PARTITION) -> LatentSpec:  # fmt: skip
    """The pass-1 spec of these pages (raises `UnsupportedSpecError` where none serves)."""
    name = dtype_name(dtype)
    kernel = kernel or pass_one_kernel(backend, name)
    return LatentSpec(kernel, backend, name, latent_dim, rope_dim, block_size, partition_size)


def partition_for(batch: int, heads: int, max_context: int) -> int:
    """Pass 1's partition length for this call: the longest that still makes
    `FILL_THREADGROUPS` threadgroups (fewer partials to write and merge), else the shortest, so
    a small batch spreads its context over the GPU (one sequence of 4k tokens: 64 threadgroups
    instead of 8)."""
    tiles = batch * -(-heads // HEADS_PER_THREADGROUP)
    for size in PARTITIONS:
        if tiles * -(-max_context // size) >= FILL_THREADGROUPS:
            return size
    return PARTITIONS[-1]


def latent_attention_decode(
    q_latent: mx.array,
    q_rope: mx.array,
    latent_pages: mx.array,
    rope_pages: mx.array,
    block_tables: mx.array,
    seq_lens: mx.array,
    *,
    scale: float,
    backend: str,
    kernel: str | None = None,
    partition_size: int | None = None,
) -> mx.array:
    """`latent_attention_reference` for one query a row at position `seq_lens - 1`, on the
    kernels: `(B, H, 1, R)` latent and `(B, H, 1, P)` RoPE queries over 16-bit pages; returns
    `(B, H, 1, R)`. `kernel` picks pass 1 ("simt" or "mma"; default: routed), `partition_size`
    its partition length (default: `partition_for` the call's shape)."""
    if not scale > 0:  # pass 1 takes the max of unscaled scores
        raise ValueError(f"the softmax scale must be positive, got {scale}")
    batch, heads = q_latent.shape[:2]
    latent_dim, rope_dim = latent_pages.shape[-1], rope_pages.shape[-1]
    block_size = latent_pages.shape[1]
    max_context = block_tables.shape[1] * block_size
    partition = partition_size or partition_for(batch, heads, max_context)
    spec = spec_for(backend, latent_pages.dtype, latent_dim, rope_dim, block_size, kernel,
                    partition)  # fmt: skip
    queries = mx.concatenate([q_latent, q_rope.astype(q_latent.dtype)], axis=-1)
    queries = queries.astype(latent_pages.dtype)
    parts = -(-max_context // partition)
    tiles = -(-heads // HEADS_PER_THREADGROUP)
    partial_out, partial_max, partial_sum = build(spec)(
        inputs=[
            queries,
            latent_pages,
            rope_pages,
            block_tables,
            seq_lens,
            constant(scale, mx.float32, backend),
        ],  # fmt: skip
        template=[("T", latent_pages.dtype)],
        grid=(tiles * spec.threads, batch, parts),
        threadgroup=(spec.threads, 1, 1),
        output_shapes=[
            (batch, heads, parts, latent_dim),
            (batch, heads, parts),
            (batch, heads, parts),
        ],  # fmt: skip
        output_dtypes=[mx.float32] * 3,
    )
    reduce = LatentSpec("reduce", backend, spec.dtype, latent_dim, rope_dim, block_size, partition)
    threads = reduce.threads
    (out,) = build(reduce)(
        inputs=[partial_out, partial_max, partial_sum, seq_lens],
        template=[("T", latent_pages.dtype)],
        grid=(heads * threads, batch, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(batch, heads, latent_dim)],
        output_dtypes=[latent_pages.dtype],
    )
    return out[:, :, None, :]


def latent_specs(backend: str) -> list[LatentSpec]:
    """A sample the compile checks and GPU tests sweep: DeepSeek-V3's rows (512 + 64) in each
    16-bit dtype and both pass-1 kernels, a smaller latent (MiniCPM3's 256 + 32), fp32, and
    blocks of 32; the shortest partition; and the reduce pass at both partition ends."""
    kernels = ("simt", "mma") if backend == "cuda" else ("simt",)
    specs = [LatentSpec(k, backend, d, 512, 64, 16) for k in kernels
             for d in ("bfloat16", "float16")]  # fmt: skip
    specs += [
        LatentSpec("simt", backend, "float32", 256, 32, 16),
        LatentSpec(kernels[-1], backend, "bfloat16", 256, 32, 32),
        LatentSpec("reduce", backend, "bfloat16", 512, 64, 16),
        LatentSpec(kernels[-1], backend, "bfloat16", 512, 64, 16, PARTITIONS[-1]),
        LatentSpec("reduce", backend, "bfloat16", 512, 64, 16, PARTITIONS[-1]),
    ]
    return specs
