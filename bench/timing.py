"""Timing for the kernel benchmarks: medians of back-to-back MLX calls (queued, chained or
pipelined), torch calls, the device copy bandwidth and MLX's per-call floor."""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.paged_attention import current_backend


def _median_seconds(run_once, sync, target_s: float, repeats: int) -> float:
    """Median seconds per call; each sample runs enough calls back to back to last `target_s`."""
    sync(run_once(1))
    tic = time.perf_counter()
    sync(run_once(1))
    single = time.perf_counter() - tic
    iters = max(2, min(200, int(target_s / max(single, 1e-6))))
    samples = []
    for _ in range(repeats):
        tic = time.perf_counter()
        sync(run_once(iters))
        samples.append((time.perf_counter() - tic) / iters)
    return statistics.median(samples)


def _mlx_sync(outs) -> None:
    mx.eval(outs)
    mx.synchronize()


def time_mlx(fn, target_s: float = 0.05, repeats: int = 7) -> float:
    """`fn()` returns an mx.array; calls are queued back to back and evaluated together."""

    def run(n):
        return [fn() for _ in range(n)]

    return _median_seconds(run, _mlx_sync, target_s, repeats)


def time_mlx_chained(
    fn, queries: mx.array, target_s: float = 0.05, repeats: int = 7, pipeline: int = 0
) -> float:
    """Like `time_mlx`, but each call's queries are the previous call's output, so the calls
    run one after another as they would in a model (and as torch's do on one stream). Queued
    calls that share no data may overlap in MLX's CUDA graphs; chained ones cannot.

    `pipeline` > 0: start evaluating every `pipeline` calls (`mx.async_eval`), so building the
    next ones overlaps the GPU's work, as the engine's lookahead decode overlaps building step
    t + 1 with step t. 0: build all the calls, then evaluate them (host time adds in full)."""

    def run(n):
        q = queries
        for i in range(n):
            q = fn(q)
            if pipeline and (i + 1) % pipeline == 0:
                mx.async_eval(q)
        return q

    return _median_seconds(run, _mlx_sync, target_s, repeats)


def time_torch(fn, target_s: float = 0.05, repeats: int = 7) -> float:
    import torch

    def run(n):
        return [fn() for _ in range(n)]

    return _median_seconds(run, lambda _: torch.cuda.synchronize(), target_s, repeats)


def copy_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Device copy bandwidth (bytes read + written per second), with MLX and with torch."""
    x = mx.random.uniform(shape=(nbytes // 4,))
    mx.eval(x)
    result = {"mlx_copy_tb_s": 2 * nbytes / time_mlx(lambda: x + 1.0) / 1e12}
    torch = cuda_torch()
    if torch is not None:
        src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        result["torch_copy_tb_s"] = 2 * nbytes / time_torch(lambda: dst.copy_(src)) / 1e12
        del src, dst
    result["copy_tb_s"] = max(result.values())
    return result


def launch_floor() -> dict:
    """Per-call time of a one-thread custom kernel and of SDPA on a tiny input: below these,
    a measurement is MLX's dispatch cost, not the kernel's."""
    backend = current_backend()
    make = mx.fast.metal_kernel if backend == "metal" else mx.fast.cuda_kernel
    kernel = make(
        name="mlx_paged_floor", input_names=["inp"], output_names=["out"], source="out[0] = inp[0];"
    )
    x = mx.zeros((1,))
    mx.eval(x)
    q = mx.zeros((1, 32, 1, 128), dtype=mx.bfloat16)
    k = mx.zeros((1, 8, 16, 128), dtype=mx.bfloat16)
    mx.eval(q, k)
    return {
        "custom_kernel_us": time_mlx(
            lambda: kernel(
                inputs=[x],
                output_shapes=[(1,)],
                output_dtypes=[mx.float32],
                grid=(1, 1, 1),
                threadgroup=(1, 1, 1),
            )[0]
        )
        * 1e6,
        "sdpa_16_tokens_us": time_mlx(
            lambda: mx.fast.scaled_dot_product_attention(q, k, k, scale=1.0)
        )
        * 1e6,
    }


def cuda_torch():
    """torch, when it is importable and sees a CUDA GPU; else None."""
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def to_torch(a: mx.array):
    """An MLX array as a CUDA torch tensor with the same values (DLPack, else host memory)."""
    torch = cuda_torch()
    try:
        t = torch.from_dlpack(a)
        if t.is_cuda:
            return t.clone()
    except Exception:  # noqa: BLE001 - any DLPack failure falls back to the host copy
        pass
    if a.dtype == mx.bfloat16:
        host = np.asarray(a.view(mx.uint16))
        return torch.from_numpy(host.view(np.int16)).cuda().view(torch.bfloat16)
    return torch.from_numpy(np.array(a)).cuda()
