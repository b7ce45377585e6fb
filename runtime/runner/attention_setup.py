"""How a model's attention runs on pages: the decode kernel chosen per K/V shape (or the
reference), compiled and warmed before serving; CUDA's bucketed prefill shapes; fused RoPE."""

from __future__ import annotations

import dataclasses
import logging
import time

import mlx.core as mx

from mlx_paged.kv.attention_adapters import ScoreRules
from mlx_paged.kv.fused_rope_setup import enable_fused_rope
from mlx_paged.kv.kv_layout import KVLayout
from mlx_paged.kv.paged_cache import PagedKVPool
from mlx_paged.kv.prefill_shapes import PrefillShapes

logger = logging.getLogger(__name__)

# Prefill shapes on CUDA come in steps of this many tokens (see `PagedKVPool.prefill_align`).
CUDA_PREFILL_ALIGN = 64


def select_decode_kernel(
    layout: KVLayout,
    block_size: int,
    mode: str,
    bits: tuple[int, int, int] = (16, 16, 0),
    rules: ScoreRules = ScoreRules(),
) -> str | None:
    """The backend whose generated kernel will run decode attention, or None for the reference.

    "auto" takes the kernel when MLX runs on a Metal/CUDA GPU and the model's shapes are ones
    the kernels are generated for (else it logs why not); "kernel" raises instead. `bits`: K
    bits, V bits and group size of the pages (below 16, the dequantizing SIMT kernels).
    `rules`: the model's score rules (`adapt_attention`), which the SIMT kernels take.
    """
    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kernels.paged_attention import current_backend

    if mode == "reference":
        return None
    backend = current_backend()
    try:
        if backend is None:
            raise UnsupportedSpecError(
                f"MLX runs on {mx.default_device()}, and the paged "
                f"decode kernels need a Metal or CUDA GPU"
            )
        if layout.latent:
            spec = _latent_kernel_spec(backend, layout, block_size, bits)
            if mode != "kernel" and not spec.tensor_cores:
                # The SIMT form: 1.0-1.7x the reference on the H100 (bench kernels), unrun on Metal.
                logger.info("latent attention decodes on the reference path; "
                            "--paged-attention kernel runs the SIMT MLA decode kernel")  # fmt: skip
                return None
            return backend
        for shape in layout.by_shape():  # layers of another K/V shape need their own kernels
            _check_kernel_shape(backend, shape, block_size, bits, rules)
    except UnsupportedSpecError as exc:
        if mode == "kernel":
            raise ValueError(f"--paged-attention kernel: {exc}") from exc
        logger.info("paged decode attention: reference path (%s)", exc)
        return None
    return backend


def _check_kernel_shape(
    backend: str, layout: KVLayout, block_size: int, bits, rules: ScoreRules = ScoreRules()
) -> None:
    """Raise `UnsupportedSpecError` unless the kernels serve this uniform layout."""
    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kernels.paged_attention_routing import routed_specs

    if layout.num_heads is None or layout.num_heads % layout.num_kv_heads:
        raise UnsupportedSpecError("the model's query heads could not be matched to its KV heads")
    if layout.query_dtype != layout.dtype:
        raise UnsupportedSpecError(
            f"queries are {layout.query_dtype} but the cache is {layout.dtype}"
        )
    gqa = layout.num_heads // layout.num_kv_heads
    for sliding, chunked in _masks(layout, rules):
        routed_specs(backend, layout.dtype, layout.head_dim, block_size, gqa, sliding,
                     bits=bits, value_dim=layout.value_dim, chunked=chunked,
                     softcap=rules.softcap)  # fmt: skip


def _latent_kernel_spec(backend: str, layout: KVLayout, block_size: int, bits):
    """The pass-1 `LatentSpec` that serves these pages; raises `UnsupportedSpecError` where
    none does."""
    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kernels.latent_attention import spec_for

    if min(bits[:2]) < 16:
        raise UnsupportedSpecError("the latent-attention kernels read 16-bit pages")
    return spec_for(backend, layout.dtype, layout.head_dim, layout.value_head_dim, block_size)


def _masks(layout: KVLayout, rules: ScoreRules) -> list[tuple[bool, bool]]:
    """(sliding window, chunked) of each kind of layer: full attention, and windowed or
    chunked layers where the model has them."""
    return (
        [(False, False)] + [(True, False)] * layout.sliding_window + [(False, True)] * rules.chunked
    )


def warm_up_kernels(
    backend: str,
    layout: KVLayout,
    block_size: int,
    rope: bool,
    bits=(16, 16, 0),
    rules: ScoreRules = ScoreRules(),
) -> None:
    """Compile every decode kernel the model will call (the `decode_rope_*` ones too when decode
    steps fuse RoPE; the dequantizing ones on pages of `bits`; for its score `rules`), logging
    each."""
    from mlx_paged.kernels.paged_attention import warm_up
    from mlx_paged.kernels.paged_attention_routing import routed_specs

    if layout.latent:
        return _warm_up_latent(backend, layout, block_size)
    variants = [
        (shape.head_dim, shape.num_heads // shape.num_kv_heads, w, r, shape.value_dim, c)
        for shape in layout.by_shape()
        for w, c in _masks(layout, rules)
        for r in ((False, True) if rope else (False,))
    ]
    total = sum(
        len(
            routed_specs(
                backend, layout.dtype, dim, block_size, gqa, w, r, bits, value_dim, c, rules.softcap
            )
        )  # fmt: skip
        for dim, gqa, w, r, value_dim, c in variants
    )
    count = [0]

    def progress(spec, seconds):
        count[0] += 1
        logger.info("compiled kernel %d/%d %s (%.1f s)", count[0], total, spec.name, seconds)

    logger.info("paged decode attention: %s kernels; compiling %d specs", backend, total)
    for dim, gqa, sliding, with_rope, value_dim, chunked in variants:
        warm_up(backend, layout.dtype, dim, block_size, gqa, sliding, progress, rope=with_rope,
                bits=bits, value_dim=value_dim, chunked=chunked,
                softcap=rules.softcap)  # fmt: skip


def _warm_up_latent(backend: str, layout: KVLayout, block_size: int) -> None:
    """Compile the latent-attention kernels' two passes, logging each."""
    from mlx_paged.kernels.latent_attention import build, spec_for

    first = spec_for(backend, layout.dtype, layout.head_dim, layout.value_head_dim, block_size)
    for i, spec in enumerate((first, dataclasses.replace(first, kernel="reduce"))):
        start = time.perf_counter()
        build(spec)
        logger.info("compiled kernel %d/2 %s (%.1f s)", i + 1, spec.name,
                    time.perf_counter() - start)  # fmt: skip


def cuda_prefill_shapes(layout: KVLayout) -> PrefillShapes | None:
    """Bucketed prefill attention where MLX's CUDA SDPA builds a graph per shape: half-precision
    K/V (float32 takes MLX's own kernels) and one query head count for every layer."""
    # The buckets' marked keys and values are of one head size, too.
    if (
        layout.dtype not in (mx.float16, mx.bfloat16)
        or len(layout.by_shape()) > 1
        or layout.values_differ
    ):
        return None
    return PrefillShapes(layout.num_heads, layout.num_kv_heads, layout.head_dim, layout.dtype)


def choose_attention_paths(
    model,
    layout: KVLayout,
    pool: PagedKVPool,
    paged_attention: str,
    fused_rope: str,
    bits,
    rules: ScoreRules,
) -> None:
    """Set the pool's decode backend (compiling and warming its kernels), its recurrence
    backend (`recurrence_hook`), CUDA's prefill shapes and fused RoPE."""
    from mlx_paged.kernels.paged_attention import current_backend

    pool.decode_backend = select_decode_kernel(
        layout, pool.block_size, paged_attention, bits, rules
    )
    pool.recurrence_backend = current_backend() if paged_attention != "reference" else None
    if mx.default_device() == mx.gpu and mx.cuda.is_available():
        pool.prefill_align = CUDA_PREFILL_ALIGN
        pool.prefill_shapes = cuda_prefill_shapes(layout)
        pool.bucket_mixed_steps = True
    if not rules.plain and fused_rope != "off":  # "on" was refused at setup
        logger.info("decode attention without fused RoPE: the model's attention has %s", rules)
        fused_rope = "off"
    rope = enable_fused_rope(model, layout, pool, fused_rope)
    if pool.decode_backend is not None:
        # Per-head 16-bit pages, read after the step's writes: latent rows decode in the
        # absorbed form, chunks over quantized pages attend their fresh K/V as prompts do, and
        # RoPE in attention writes a row's keys only after it attended.
        pool.chunks_as_rows = not (layout.latent or pool.quantized or rope)
        warm_up_kernels(pool.decode_backend, layout, pool.block_size, rope, bits, rules)
