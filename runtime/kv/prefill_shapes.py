"""Prefill attention in few shapes, met before serving: CUDA's answer to per-shape graph builds.

On CUDA, MLX's SDPA builds a cuDNN graph for every new (batch, query length, key length) it
meets: about 60 ms on the H200, on the engine thread, while every decoding stream waits. So
prefill attention here runs in power-of-two buckets, and `warm_up` builds every bucket a step
can meet before the first request.

- Rows that start at 0 (`attend_own`): the batch and the width are padded at the end; MLX's
  causal SDPA aligns queries to the end of the keys, so the real queries never see padding.
- A row over its context (`attend_row`): its queries are padded at the end to a bucket, its
  keys alike, and the keys again at the front up to a bucket. Front padding would be seen by
  every query, so a few extra head dims (`MARK_DIMS`) carry a mark: zero for real keys, a
  score of `MASK_SCORE` for padding keys, so they get no weight. That needs head dims to spare
  under cuDNN's 128; models without them keep shapes that vary with the row (`rows_bucketed`).
"""

from __future__ import annotations

import logging
import threading

import mlx.core as mx

from mlx_paged.kv.shape_buckets import bucket as pow2_bucket
from mlx_paged.progress import progress

logger = logging.getLogger(__name__)

MIN_BUCKET = 64  # the smallest query/key bucket
MARK_DIMS = 8  # extra head dims carrying the padding mark (cuDNN wants multiples of 8)
CUDNN_MAX_HEAD_DIM = 128
MASK_SCORE = -1e4  # a padding key's score, after the softmax scale
_QUERY_MARK = 64.0


def bucket(n: int) -> int:
    """The power of two at or above `n`, at least `MIN_BUCKET`."""
    return pow2_bucket(n, MIN_BUCKET)


class PrefillShapes:
    """Bucketed prefill attention for one model's geometry (query heads, KV heads, head dim)."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: mx.Dtype):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype = dtype
        self.rows_bucketed = head_dim + MARK_DIMS <= CUDNN_MAX_HEAD_DIM
        self._marks: dict[tuple[float, mx.Dtype], tuple[mx.array, mx.array]] = {}
        self._warm_threads: set[int] = set()

    def attend_own(self, queries, keys, values, scale: float) -> mx.array:
        """Causal SDPA of rows over their own K/V, batch and width padded to buckets."""
        b, _, w, _ = queries.shape
        pads = ((0, pow2_bucket(b) - b), (0, 0), (0, bucket(w) - w), (0, 0))
        q, k, v = (mx.contiguous(mx.pad(x, pads)) for x in (queries, keys, values))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
        return out[:b, :, :w]

    def attend_row(self, queries, keys, values, scale: float) -> mx.array:
        """Causal SDPA of one row's queries (1, H, n, D) over its keys and values (1, KV,
        total, D), which end with the queries' own; padded to buckets as the module says."""
        n, total = queries.shape[2], keys.shape[2]
        end = bucket(n) - n
        front = bucket(total + end) - total - end
        q_mark, k_mark = self._mark(scale, queries.dtype)
        q = mx.pad(queries, ((0, 0), (0, 0), (0, end), (0, 0)))
        q = mx.concatenate([q, mx.broadcast_to(q_mark, (*q.shape[:3], MARK_DIMS))], axis=-1)
        k = mx.pad(keys, ((0, 0), (0, 0), (0, end), (0, MARK_DIMS)))
        k = mx.concatenate([mx.broadcast_to(k_mark, (1, k.shape[1], front, k.shape[3])), k], 2)
        v = mx.pad(values, ((0, 0), (0, 0), (front, end), (0, 0)))
        q, k, v = mx.contiguous(q), mx.contiguous(k), mx.contiguous(v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
        return out[:, :, :n]

    def _mark(self, scale: float, dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """(query mark, padding key row): their product, scaled, is `MASK_SCORE`."""
        key = (scale, dtype)
        if key not in self._marks:
            q_mark = mx.zeros((MARK_DIMS,)).at[0].add(_QUERY_MARK)
            k_mark = mx.zeros((self.head_dim + MARK_DIMS,))
            k_mark = k_mark.at[self.head_dim].add(MASK_SCORE / (_QUERY_MARK * scale))
            self._marks[key] = (q_mark.astype(dtype), k_mark.astype(dtype))
            mx.eval(self._marks[key])
        return self._marks[key]

    def shapes(self, max_rows: int, max_width: int, max_len: int) -> list[tuple[str, int, int]]:
        """Every bucket a step can meet: ("own", rows, width) and ("row", queries, keys), for
        up to `max_rows` rows of up to `max_width` tokens and contexts up to `max_len`."""
        first, last = MIN_BUCKET.bit_length() - 1, bucket(max_width).bit_length()
        widths = [1 << i for i in range(first, last)]
        out = [
            ("own", 1 << i, w) for i in range(pow2_bucket(max_rows).bit_length()) for w in widths
        ]
        if self.rows_bucketed:
            for q in widths:
                longest = bucket(max_len + q - 1)
                out += [("row", q, 1 << i) for i in range(q.bit_length() - 1, longest.bit_length())]
        return out

    def warm_up(self, max_rows: int, max_width: int, max_len: int) -> None:
        """Build every bucket's graph on the calling thread (MLX keeps them per thread); once
        per thread."""
        if threading.get_ident() in self._warm_threads:
            return
        shapes = self.shapes(max_rows, max_width, max_len)
        desc = "warming prefill attention shapes (CUDA builds a graph per shape)"
        for shape in progress(shapes, desc, unit="shape", log=logger):
            self._run(*shape)
        self._warm_threads.add(threading.get_ident())

    def _run(self, kind: str, a: int, b: int) -> None:
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if kind == "own":
            q, k = mx.zeros((a, h, b, d), self.dtype), mx.zeros((a, kv, b, d), self.dtype)
            mx.eval(self.attend_own(q, k, k, scale=d**-0.5))
        else:  # a row of `a` queries over `b` keys: the bucket, with no padding to add
            q = mx.zeros((1, h, a, d), self.dtype)
            k = mx.zeros((1, kv, b, d), self.dtype)
            mx.eval(self.attend_row(q, k, k, scale=d**-0.5))
