"""Launcher of the paged decode-attention kernels (`paged_attention.jinja`, pass 1 or the only
pass; `paged_attention_reduce.jinja`, pass 2). Rendering is in `paged_attention_geometry`, the
routing in `paged_attention_routing`, each shape's launch in `paged_attention_plan`; the oracle
is `paged_attention_reference`."""

from __future__ import annotations

import functools
import time

import mlx.core as mx

from mlx_paged.kernels.counter_chain import CounterChain
from mlx_paged.kernels.kernel_inputs import constant
from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.page_inputs import check_quantized_sides, flat_rows, page_bits, page_shape
from mlx_paged.kernels.paged_attention_plan import launch_plan
from mlx_paged.kernels.paged_attention_routing import routed_specs
from mlx_paged.kernels.quantized_pages import QuantizedKVPages, QuantizedPages

# Every fused call counts its partitions on counters the previous call zeroed.
_COUNTERS = CounterChain()


def current_backend() -> str | None:
    """The backend, "metal" or "cuda", when MLX's default device is a GPU; else None."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return None
    return _gpu_backend()


@functools.cache
def _gpu_backend() -> str | None:
    """The GPU backend this MLX build has (it cannot change in a process)."""
    if mx.metal.is_available():
        return "metal"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return None


def paged_attention_decode(
    queries: mx.array,
    k_pages: mx.array | QuantizedPages,
    v_pages: mx.array | QuantizedPages,
    block_tables: mx.array,
    seq_lens: mx.array,
    *,
    scale: float,
    window: int | None = None,
    sinks: mx.array | None = None,
    backend: str | None = None,
    kernel: str | None = None,
    partition_size: int | None = None,
    compiled: bool = True,
    counters: CounterChain | None = None,
    chunk: int | None = None,
    softcap: float | None = None,
    block_size: int | None = None,
    flat_output: bool = False,
) -> mx.array:
    """Decode attention of `(B, Hq, 1, D)` queries over paged K/V, on the GPU kernels.

    Each row's one query sits at position `p = seq_lens[b] - 1` and sees keys `[0, p]` (the
    last `window` of them with a sliding window; with a `chunk`, those from `p // chunk *
    chunk` on, as llama4's chunked attention). With a `softcap`, scores become
    `softcap * tanh(score / softcap)` (gemma2). Pages are `[num_blocks, block_size,
    Hkv, D]` (V's may have a head size of their own, Dv, which the output then has),
    row-contiguous, or `QuantizedPages` of that shape (the kernels dequantize
    them in registers: the K and V sides of one `QuantizedKVPages`); `block_tables` is `(B,
    max_blocks)` int32. The kernels read 16-bit pages as flat rows `[num_blocks * block_size,
    Hkv, D]`: the pool's are, with `block_size` given; 4D ones are flattened (`flat_rows`).

    Args:
        kernel: run this kernel (a pass-1 name of `KERNELS`, for tests and benchmarks);
            None routes (`paged_attention_routing.route`).
        partition_size: with `kernel`, its partition length (default: the routed one).
        flat_output: return `(B, Hq * Dv)` rows instead of `(B, Hq, 1, Dv)` (no reshape node
            before an output projection).
        compiled: False builds the kernel nodes anew on every call (`LaunchPlan.launch_eager`),
            for `bench/host_cost.py` to compare against.
        counters: the chain of the fused split-K's partition counters (default: the process's
            own); a caller that traces a step around this call passes one it seeds and reads.

    Raises:
        UnsupportedSpecError: for an input the kernels cannot serve (the message names the spec).
    """
    backend = backend or current_backend()
    if window is not None and chunk is not None:
        raise UnsupportedSpecError("a decode call takes a sliding window or a chunk, not both")
    plan = _checked_plan(queries, k_pages, v_pages, block_tables, window or chunk, sinks,
                         backend, kernel, partition_size, chunked=chunk is not None,
                         softcap=softcap is not None, block_size=block_size,
                         flat_output=flat_output)  # fmt: skip
    inputs = _inputs(queries, k_pages, v_pages, block_tables, seq_lens, scale, window or chunk,
                     backend)  # fmt: skip
    if softcap is not None:
        inputs.append(constant(float(softcap), mx.float32, backend))
    return _launch(plan, inputs, compiled, counters)[0]


def paged_attention_decode_rope(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    k_pages: mx.array,
    v_pages: mx.array,
    block_tables: mx.array,
    seq_lens: mx.array,
    *,
    scale: float,
    rope_inv_freq: mx.array,
    window: int | None = None,
    backend: str | None = None,
    kernel: str | None = None,
    partition_size: int | None = None,
    counters: CounterChain | None = None,
    block_size: int | None = None,
) -> tuple[mx.array, mx.array]:
    """The decode step's RoPE and attention in one kernel (`decode_rope_*`).

    Queries `(B, Hq, 1, D)`, keys and values `(B, Hkv, 1, D)` are the step's own, not yet
    rotated; row b's token sits at position `seq_lens[b] - 1`, and the pages hold its keys
    `[0, seq_lens[b] - 1)`. The kernel rotates the query and the key (non-interleaved RoPE,
    angle `position * rope_inv_freq[i]` for dims i and i + len(rope_inv_freq); later dims pass
    through) and attends over the pages plus the new token. Pages as `paged_attention_decode`
    takes them (flat rows with `block_size`).

    Returns:
        `(attention output (B, Hq, 1, D), rotated keys (B, Hkv, 1, D))`; the caller writes the
        rotated keys and `values` into the pages.

    Raises:
        UnsupportedSpecError: as `paged_attention_decode`, and for new K/V that do not match.
    """
    backend = backend or current_backend()
    plan = _checked_plan(queries, k_pages, v_pages, block_tables, window, None, backend, kernel,
                         partition_size, rope=True, block_size=block_size)  # fmt: skip
    expected = (queries.shape[0], page_shape(k_pages, block_size)[2], 1, queries.shape[3])
    if keys.shape != expected or values.shape != expected or keys.dtype != queries.dtype:
        raise UnsupportedSpecError(
            f"{plan.name}: new keys {keys.shape} {keys.dtype} / values {values.shape} do not "
            f"match {expected} {queries.dtype}"
        )
    inputs = _inputs(queries, k_pages, v_pages, block_tables, seq_lens, scale, window, backend)
    inputs += [keys, values, rope_inv_freq.astype(mx.float32)]
    outputs = _launch(plan, inputs, True, counters)
    return outputs[0], outputs[1]


def _inputs(queries, k_pages, v_pages, block_tables, seq_lens, scale, window, backend) -> list:
    if block_tables.dtype != mx.int32:
        block_tables = block_tables.astype(mx.int32)
    if seq_lens.dtype != mx.int32:
        seq_lens = seq_lens.astype(mx.int32)
    scale_input = constant(float(scale), mx.float32, backend)
    if isinstance(k_pages, QuantizedPages):  # one array holds both sides
        pages = [k_pages.kv.rows]
    else:  # the kernels read 16-bit pages as flat rows, as the pool stores them
        pages = [flat_rows(k_pages), flat_rows(v_pages)]
    inputs = [queries, *pages, block_tables, seq_lens, scale_input]
    if window is not None:
        inputs.append(constant(int(window), mx.int32, backend))
    return inputs


def _launch(plan, inputs: list, compiled: bool, counters: CounterChain | None) -> list:
    """The plan's outputs (see `LaunchPlan.launch`), its counters chained through `counters`."""
    launch = plan.launch if compiled else plan.launch_eager
    if plan.fused:
        chain = counters if counters is not None else _COUNTERS
        return chain.call(plan.counter_slots, lambda zeros: launch(*inputs, zeros))
    return launch(*inputs)


def _checked_plan(queries, k_pages, v_pages, block_tables, window, sinks, backend, kernel,
                  partition_size, rope=False, chunked=False, softcap=False,
                  block_size=None, flat_output=False):  # fmt: skip
    """The launch plan of this call's shape, after the checks that need no GPU work
    (`window`: the window or, `chunked`, the chunk size)."""
    if backend is None:
        raise UnsupportedSpecError(
            "paged decode kernels need MLX's Metal or CUDA backend; "
            "the CPU runs paged_attention_reference"
        )
    num_seqs, num_heads, num_queries, head_dim = queries.shape
    k_shape, v_shape = page_shape(k_pages, block_size), page_shape(v_pages, block_size)
    value_dim = v_shape[3] if v_shape[3] != head_dim else 0
    plan = launch_plan(
        backend, queries.dtype, num_seqs, num_heads, num_queries, head_dim, k_shape[1],
        k_shape[2], block_tables.shape[1], window is not None and not chunked, kernel,
        partition_size, rope, page_bits(k_pages, v_pages), value_dim, chunked, softcap,
        flat_output,
    )  # fmt: skip
    if sinks is not None:
        raise UnsupportedSpecError(f"{plan.name}: attention sinks are not implemented")
    check_quantized_sides(plan.name, k_pages, v_pages)
    k_dtype, v_dtype = k_pages.dtype, v_pages.dtype
    if (
        k_shape[3] != head_dim
        or v_shape[:3] != k_shape[:3]
        or not k_dtype == v_dtype == queries.dtype
    ):
        raise UnsupportedSpecError(
            f"{plan.name}: queries {queries.shape} {queries.dtype} do "
            f"not match pages {k_pages.shape} {k_dtype}/{v_dtype}"
        )
    return plan


def warm_up(
    backend: str,
    dtype: mx.Dtype,
    head_dim: int,
    block_size: int,
    gqa: int,
    sliding_window: bool,
    progress=None,
    rope: bool = False,
    bits: tuple[int, int, int] = (16, 16, 0),
    value_dim: int = 0,
    chunked: bool = False,
    softcap: bool = False,
) -> list[KernelSpec]:
    """Compile every kernel a model's decode will call (`routed_specs`; with `rope`, their
    `decode_rope_*` forms; on pages of `bits`, see `page_bits`; V heads of `value_dim` where
    not K's; chunked or soft-capped scores), one tiny call each.

    NVRTC/Metal compile a spec on its first call (about 2 s each on CUDA); doing it at load keeps
    that out of the first requests. `progress(spec, seconds)` reports each one.
    """
    specs = routed_specs(backend, dtype, head_dim, block_size, gqa, sliding_window, rope, bits,
                         value_dim, chunked, softcap)  # fmt: skip
    window = 4 if sliding_window else None
    rules = dict(chunk=4 if chunked else None, softcap=50.0 if softcap else None)
    shape = (17, block_size, 1, head_dim)
    if min(bits[:2]) < 16:
        kv = QuantizedKVPages.zeros(shape, dtype, *bits)
        k_pages, v_pages = kv.k, kv.v
    else:
        k_pages = mx.zeros(shape, dtype=dtype)
        v_pages = mx.zeros((*shape[:3], value_dim or head_dim), dtype=dtype)
    for spec in specs:
        if spec.is_reduce:
            continue  # it compiles with the pass 1 of its partition size
        tic = time.perf_counter()
        # Batch 1 and batch 8: Metal keeps inputs under 8 elements in constant memory, which is
        # a separate compile; CUDA reuses the first build.
        for batch in (1, 8):
            queries = mx.zeros((batch, gqa, 1, head_dim), dtype=dtype)
            tables = mx.array([[2 * b + 1, 2 * b + 2] for b in range(batch)], dtype=mx.int32)
            lens = mx.full((batch,), block_size + 1, dtype=mx.int32)
            args = (k_pages, v_pages, tables, lens)
            forced = dict(scale=1.0, window=window, backend=backend, kernel=spec.kernel,
                          partition_size=spec.partition_size or None)  # fmt: skip
            if rope:
                new = mx.zeros((batch, 1, 1, head_dim), dtype=dtype)
                freqs = mx.ones((head_dim // 2,), dtype=mx.float32)
                mx.eval(paged_attention_decode_rope(queries, new, new, *args,
                                                    rope_inv_freq=freqs, **forced))  # fmt: skip
            else:
                mx.eval(paged_attention_decode(queries, *args, **forced, **rules))
        if progress is not None:
            progress(spec, time.perf_counter() - tic)
    return specs
