"""The bandwidth ceiling of the paged access pattern: a kernel that reads exactly the K/V bytes
the paged decode kernel reads, in the same order and through the same block tables, and does no
attention math. Its gap to the decode kernel is the cost of the math; its gap to the copy
bandwidth is the cost of reading 16-token pages of one KV head scattered through a pool.
CUDA only (a benchmark diagnostic, not a product kernel)."""

from __future__ import annotations

import functools

import mlx.core as mx

WARPS = 4
PAGES_PER_PARTITION = 32  # 512 tokens at block 16, like the split-K kernel

_SOURCE = """
const int head = blockIdx.x;
const int seq = blockIdx.y;
const int warp = threadIdx.x >> 5;
const int lane = threadIdx.x & 31;
const int row = lane / TPR;
const int sub = lane % TPR;
const int pages = (seq_lens[seq] + BS - 1) / BS;
const int first = blockIdx.z * PPP;
const int last = min(pages, first + PPP);
unsigned acc = 0;
for (int p = first + warp; p < last; p += WARPS) {
  const long long blk = block_tables[seq * block_tables_strides[0] + p];
  uint4 k[BS / (32 / TPR)];
  uint4 v[BS / (32 / TPR)];
  #pragma unroll
  for (int t = 0; t < BS / (32 / TPR); ++t) {
    const long long r = t * (32 / TPR) + row;
    k[t] = *reinterpret_cast<const uint4*>(k_pages + blk * k_pages_strides[0] + r * k_pages_strides[1] + head * k_pages_strides[2] + sub * (16 / sizeof(T)));
    v[t] = *reinterpret_cast<const uint4*>(v_pages + blk * v_pages_strides[0] + r * v_pages_strides[1] + head * v_pages_strides[2] + sub * (16 / sizeof(T)));
  }
  #pragma unroll
  for (int t = 0; t < BS / (32 / TPR); ++t) acc ^= k[t].x ^ k[t].y ^ k[t].z ^ k[t].w ^ v[t].x ^ v[t].y ^ v[t].z ^ v[t].w;
}
out[((blockIdx.z * gridDim.y + seq) * gridDim.x + head) * blockDim.x + threadIdx.x] = acc;
"""


@functools.cache
def _kernel():
    return mx.fast.cuda_kernel(
        name="mlx_paged_bench_paged_read",
        input_names=["k_pages", "v_pages", "block_tables", "seq_lens"],
        output_names=["out"],
        source=_SOURCE,
        ensure_row_contiguous=False,
    )


def paged_read(
    k_pages: mx.array, v_pages: mx.array, block_tables: mx.array, seq_lens: mx.array
) -> mx.array:
    """Read every K/V byte the decode kernel reads (16-byte lanes, a whole page's loads in
    flight per warp, a threadgroup per (KV head, sequence, 512-token partition))."""
    _, block_size, num_kv_heads, head_dim = k_pages.shape
    row_units = head_dim * k_pages.dtype.size // 16
    num_seqs, max_pages = block_tables.shape
    parts = -(-max_pages // PAGES_PER_PARTITION)
    threads = WARPS * 32
    return _kernel()(
        inputs=[k_pages, v_pages, block_tables, seq_lens],
        template=[
            ("T", k_pages.dtype),
            ("BS", block_size),
            ("TPR", row_units),
            ("WARPS", WARPS),
            ("PPP", PAGES_PER_PARTITION),
        ],
        grid=(num_kv_heads * threads, num_seqs, parts),
        threadgroup=(threads, 1, 1),
        output_shapes=[(parts * num_seqs * num_kv_heads * threads,)],
        output_dtypes=[mx.uint32],
    )[0]
