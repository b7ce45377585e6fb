"""MLA decode over latent pages (`bench kernels --latent-dims R P`): the routed latent kernel,
each pass-1 kernel forced, and the gather reference, on one shuffled pool of latent rows at
least `--pool-gb` large, beside the device copy bandwidth measured in the same run. Every
method's output is checked against the routed kernel's. TB/s count the latent and RoPE rows
each method must read once (`R + P` values a token); all `--num-heads` heads share them.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from mlx_paged.codegen.build import KernelRenderError
from mlx_paged.kernels.kernel_inputs import input_array
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.latent_attention import latent_attention_decode
from mlx_paged.kernels.latent_attention_reference import latent_attention_reference
from mlx_paged.kernels.paged_attention import current_backend

_DTYPES = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}
PASS_ONE = ("simt", "mma")


def latent_problem(batch: int, context: int, args, seed: int = 0) -> dict:
    """Queries, a shuffled pool of latent and RoPE pages, tables and lengths."""
    latent_dim, rope_dim = args.latent_dims
    dtype, bs = _DTYPES[args.dtype], args.block_size
    per_row = math.ceil(context / bs)
    row_bytes = (latent_dim + rope_dim) * dtype.size
    num_blocks = max(batch * per_row + 1, int(args.pool_gb * 2**30) // (bs * row_bytes))
    rng = np.random.default_rng(seed)
    ids = rng.permutation(np.arange(1, num_blocks))[: batch * per_row]
    keys = iter(mx.random.split(mx.random.key(seed), 4))
    latent = mx.random.normal((num_blocks, bs, 1, latent_dim), key=next(keys)).astype(dtype)
    rope = mx.random.normal((num_blocks, bs, 1, rope_dim), key=next(keys)).astype(dtype)
    q_latent = mx.random.normal((batch, args.num_heads, 1, latent_dim), key=next(keys))
    q_rope = mx.random.normal((batch, args.num_heads, 1, rope_dim), key=next(keys))
    mx.eval(latent, rope)
    return {
        "q": (q_latent.astype(dtype), q_rope.astype(dtype)),
        "pages": (latent, rope),
        "tables": input_array(ids.reshape(batch, per_row)),
        "lens": input_array([context] * batch),
        "scale": (latent_dim // 4 + rope_dim) ** -0.5,
        "read_bytes": batch * context * row_bytes,
    }


def latent_runs(problem: dict, args) -> dict:
    """Each method as a function of the latent queries, returning an output of their shape (so
    `--chained` can feed it back): `paged` (routed), `paged_<kernel>` for each pass-1 kernel
    (on a GPU), and `gather_sdpa` (the reference)."""
    p, backend = problem, current_backend()

    def paged(kernel=None):
        return lambda q_latent: latent_attention_decode(
            q_latent, p["q"][1], *p["pages"], p["tables"], p["lens"], scale=p["scale"],
            backend=backend, kernel=kernel)  # fmt: skip

    def gather_sdpa(q_latent):
        positions = (p["lens"] - 1)[:, None]
        return latent_attention_reference(q_latent, p["q"][1], *p["pages"], p["tables"],
                                          p["lens"], positions, scale=p["scale"])  # fmt: skip

    runs = {"paged": paged(), **{f"paged_{k}": paged(k) for k in PASS_ONE}} if backend else {}
    runs["gather_sdpa"] = gather_sdpa
    return runs


def bench_latent_shape(batch: int, context: int, args, time_fn) -> dict:
    """Time every method at one shape (`time_fn(fn, q_latent)`: microseconds a call of `fn`
    on queries `q_latent`); the results row."""
    problem = latent_problem(batch, context, args)
    q_latent = problem["q"][0]
    row = {"batch": batch, "context": context, "kv_bytes": problem["read_bytes"],
           "read_bytes": problem["read_bytes"], "us": {}, "tb_s": {},
           "max_abs_diff_vs_paged": {}}  # fmt: skip
    outputs = {}
    for name, fn in latent_runs(problem, args).items():
        try:
            outputs[name] = fn(q_latent)
            mx.eval(outputs[name])
        except (UnsupportedSpecError, KernelRenderError) as exc:  # a kernel this shape refuses
            row.setdefault("skipped", {})[name] = str(exc)
            continue
        row["us"][name] = time_fn(fn, q_latent)
        row["tb_s"][name] = problem["read_bytes"] / (row["us"][name] * 1e-6) / 1e12
    base = next((n for n in ("paged", "gather_sdpa") if n in outputs), None)
    row["diff_base"] = base
    for name, out in outputs.items():
        diff = mx.abs(out.astype(mx.float32) - outputs[base].astype(mx.float32)).max()
        row["max_abs_diff_vs_paged"][name] = diff.item()
    mx.clear_cache()
    return row
