template <typename T>
[[kernel]] void custom_kernel_latent_simt_metal_bf16_r512_p64_bs16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_float_float_float(
  const device bfloat16_t* queries [[buffer(0)]],
  const constant int* queries_shape [[buffer(1)]],
  const constant int64_t* queries_strides [[buffer(2)]],
  const device bfloat16_t* latent_pages [[buffer(3)]],
  const constant int64_t* latent_pages_strides [[buffer(4)]],
  const device bfloat16_t* rope_pages [[buffer(5)]],
  const constant int64_t* rope_pages_strides [[buffer(6)]],
  const device int32_t* block_tables [[buffer(7)]],
  const constant int64_t* block_tables_strides [[buffer(8)]],
  const device int32_t* seq_lens [[buffer(9)]],
  const constant float* scale [[buffer(10)]],
  device float* partial_out [[buffer(11)]],
  device float* partial_max [[buffer(12)]],
  device float* partial_sum [[buffer(13)]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]],
  uint3 threadgroups_per_grid [[threadgroups_per_grid]],
  uint3 threads_per_threadgroup [[threads_per_threadgroup]]) {
// latent_simt_metal_bf16_r512_p64_bs16
constexpr int LATENT = 512;
constexpr int ROPE = 64;
constexpr int KDIM = LATENT + ROPE;
constexpr int BLOCK_SIZE = 16;
constexpr int PARTITION = 512;
constexpr int HEADS = 16;  // query heads a threadgroup
constexpr int TOKENS = 16;  // tokens a tile
constexpr int ROW = KDIM + 8;  // a staged row, padded against bank conflicts
constexpr int VEC = 16 / int(sizeof(T));  // elements a 16-byte load stages
const float la_fmin = Limits<float>::finite_min;

const int la_tid = thread_index_in_threadgroup;
const int la_seq = threadgroup_position_in_grid.y;
const int la_part = threadgroup_position_in_grid.z;
const int la_num_heads = queries_shape[1];
const int la_num_parts = threadgroups_per_grid.z;
const int la_len = seq_lens[la_seq];
const int la_begin = la_part * PARTITION;
// Partitions past the row's end exit before any barrier (uniform across the threadgroup).
if (la_begin >= la_len) {
  return;
}
const int la_end = min(la_len, la_begin + PARTITION);
const int la_head0 = threadgroup_position_in_grid.x * HEADS;
const float la_scale = scale[0] * 1.4426950408889634f;  // scores in base 2
const device int* la_table = block_tables + la_seq * block_tables_strides[0];

threadgroup T la_kv[TOKENS * ROW];
constexpr int SPLIT = 8;  // threads a head: consecutive lanes, reduced by shuffles
constexpr int QDIMS = KDIM / SPLIT;  // query dims a thread
constexpr int ODIMS = LATENT / SPLIT;  // output dims a thread
const int la_part_of_head = la_tid % SPLIT;
const int la_head = la_head0 + la_tid / SPLIT;
const bool la_live = la_head < la_num_heads;
float la_q[QDIMS];
for (int i = 0; i < QDIMS; ++i) {
  la_q[i] = la_live ? static_cast<float>(queries[la_seq * queries_strides[0] + la_head * queries_strides[1] + la_part_of_head * QDIMS + i]) : 0.0f;
}
float la_o[ODIMS];
for (int i = 0; i < ODIMS; ++i) la_o[i] = 0.0f;
float la_m = la_fmin, la_l = 0.0f;

for (int tok0 = la_begin; tok0 < la_end; tok0 += TOKENS) {
  {
    const int64_t block = la_table[tok0 / BLOCK_SIZE];
    const int first = tok0 % BLOCK_SIZE;
    for (int v = la_tid; v < TOKENS * (KDIM / VEC); v += threads_per_threadgroup.x) {
      const int r = v / (KDIM / VEC), c = (v % (KDIM / VEC)) * VEC;
      uint4 x;
      x.x = x.y = x.z = x.w = 0u;
      if (tok0 + r < la_end) {
        x = c < LATENT
            ? *reinterpret_cast<const device uint4*>(latent_pages + block * latent_pages_strides[0] + (first + r) * latent_pages_strides[1] + c)
            : *reinterpret_cast<const device uint4*>(rope_pages + block * rope_pages_strides[0] + (first + r) * rope_pages_strides[1] + (c - LATENT));
      }
      *reinterpret_cast<threadgroup uint4*>(la_kv + r * ROW + c) = x;
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s[TOKENS];
  float top = la_fmin;
  for (int t = 0; t < TOKENS; ++t) {
    const threadgroup T* row = la_kv + t * ROW + la_part_of_head * QDIMS;
    float acc = 0.0f;
    for (int i = 0; i < QDIMS; ++i) acc += la_q[i] * static_cast<float>(row[i]);
    acc += simd_shuffle_xor(acc, 1);
    acc += simd_shuffle_xor(acc, 2);
    acc += simd_shuffle_xor(acc, 4);
    s[t] = acc * la_scale;
    top = tok0 + t < la_end ? max(top, s[t]) : top;
  }
  const float m_new = max(la_m, top);
  const float corr = fast::exp2(la_m - m_new);
  la_m = m_new;
  la_l *= corr;
  for (int i = 0; i < ODIMS; ++i) la_o[i] *= corr;
  for (int t = 0; t < TOKENS; ++t) {
    const float p = tok0 + t < la_end ? fast::exp2(s[t] - m_new) : 0.0f;
    la_l += p;
    const threadgroup T* row = la_kv + t * ROW + la_part_of_head * ODIMS;
    for (int i = 0; i < ODIMS; ++i) la_o[i] += p * static_cast<float>(row[i]);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
}
if ((la_head) < la_num_heads) {
  const int64_t base = (int64_t(la_seq) * la_num_heads + (la_head)) * la_num_parts + la_part;
  if (la_part_of_head == 0) {
    partial_max[base] = la_m;
    partial_sum[base] = la_l;
  }
  for (int i = 0; i < ODIMS; ++i) partial_out[base * LATENT + la_part_of_head * ODIMS + i] = la_o[i];
}
}

template [[host_name("custom_kernel_latent_simt_metal_bf16_r512_p64_bs16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_float_float_float")]] [[kernel]] decltype(custom_kernel_latent_simt_metal_bf16_r512_p64_bs16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_float_float_float<bfloat16_t>) custom_kernel_latent_simt_metal_bf16_r512_p64_bs16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_float_float_float<bfloat16_t>;

