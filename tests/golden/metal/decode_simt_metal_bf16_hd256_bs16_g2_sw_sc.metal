template <typename T>
[[kernel]] void custom_kernel_decode_simt_metal_bf16_hd256_bs16_g2_sw_sc__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_int32_tc_floatc_bfloat16_t(
  const device bfloat16_t* queries [[buffer(0)]],
  const constant int64_t* queries_strides [[buffer(1)]],
  const device bfloat16_t* k_pages [[buffer(2)]],
  const constant int64_t* k_pages_strides [[buffer(3)]],
  const device bfloat16_t* v_pages [[buffer(4)]],
  const constant int64_t* v_pages_strides [[buffer(5)]],
  const device int32_t* block_tables [[buffer(6)]],
  const constant int64_t* block_tables_strides [[buffer(7)]],
  const device int32_t* seq_lens [[buffer(8)]],
  const constant float* scale [[buffer(9)]],
  const constant int32_t* window [[buffer(10)]],
  const constant float* softcap [[buffer(11)]],
  device bfloat16_t* out [[buffer(12)]],
  uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]],
  uint3 threadgroups_per_grid [[threadgroups_per_grid]]) {
// decode_simt_metal_bf16_hd256_bs16_g2_sw_sc
constexpr int HEAD_DIM = 256;
constexpr int VALUE_DIM = 256;  // V's head size: each output row's
constexpr int BLOCK_SIZE = 16;
constexpr int GQA = 2;
constexpr int NSG = 4;
constexpr int TPR = 32;
constexpr int EPL = 8;
constexpr int EPL_V = 8;
constexpr int RPW = 32 / TPR;
constexpr int TOK = BLOCK_SIZE / RPW;
constexpr int CHUNK = 16;
const float pa_log2e = 1.4426950408889634f;
const float pa_fmin = Limits<float>::finite_min;

const int pa_kv_head = threadgroup_position_in_grid.x;
const int pa_seq = threadgroup_position_in_grid.y;
const int pa_num_kv_heads = threadgroups_per_grid.x;
// 16-bit pages arrive as flat rows [blocks * BLOCK_SIZE, heads, dim] (the launcher flattens 4D
// ones): a block, a token row and a head apart.
const int64_t pa_k_strides[3] = {BLOCK_SIZE * k_pages_strides[0], k_pages_strides[0], k_pages_strides[1]};
const int64_t pa_v_strides[3] = {BLOCK_SIZE * v_pages_strides[0], v_pages_strides[0], v_pages_strides[1]};
const int pa_sg = simdgroup_index_in_threadgroup;
const int pa_lane = thread_index_in_simdgroup;
const int pa_tid = thread_index_in_threadgroup;
const int pa_row = pa_lane / TPR;
const int pa_sub = pa_lane % TPR;

const int pa_len = seq_lens[pa_seq];
int pa_begin = 0;
int pa_end = pa_len;
// Decode queries sit at position len - 1 and see the last `window` keys.
pa_begin = max(pa_begin, pa_len - window[0]);
if (pa_begin >= pa_end) {
  for (int i = pa_tid; i < GQA * VALUE_DIM; i += NSG * 32) {
    const int g = i / VALUE_DIM;
    out[(int64_t(pa_seq) * pa_num_kv_heads * GQA + pa_kv_head * GQA + g) * VALUE_DIM + i % VALUE_DIM] = static_cast<T>(0.0f);
  }
  return;
}

// Queries of the group, pre-scaled into the exp2 domain.
const float pa_qscale = scale[0] * pa_log2e;
const float pa_cap = softcap[0] * pa_log2e;
float pa_q[GQA][EPL];
#pragma unroll
for (int g = 0; g < GQA; ++g) {
  const int64_t qoff = int64_t(pa_seq) * queries_strides[0] + int64_t(pa_kv_head * GQA + g) * queries_strides[1];
  #pragma unroll
  for (int i = 0; i < EPL; ++i) {
    pa_q[g][i] = static_cast<float>(queries[qoff + int64_t(pa_sub * EPL + i) * queries_strides[3]]) * pa_qscale;
  }
}

float pa_m[GQA];
float pa_l[GQA];
float pa_o[GQA][EPL_V];
#pragma unroll
for (int g = 0; g < GQA; ++g) {
  pa_m[g] = pa_fmin;
  pa_l[g] = 0.0f;
  #pragma unroll
  for (int i = 0; i < EPL_V; ++i) pa_o[g][i] = 0.0f;
}

const int pa_first_page = pa_begin / BLOCK_SIZE;
const int pa_last_page = (pa_end - 1) / BLOCK_SIZE;
const int64_t pa_table_row = int64_t(pa_seq) * block_tables_strides[0];
const int64_t pa_k_head = int64_t(pa_kv_head) * pa_k_strides[2] + pa_sub * EPL;
const int64_t pa_v_head = int64_t(pa_kv_head) * pa_v_strides[2] + pa_sub * EPL_V;
// The next page's block id is fetched one page ahead, off the K/V loads' critical path.
int64_t pa_block = pa_first_page + pa_sg <= pa_last_page
    ? int64_t(block_tables[pa_table_row + int64_t(pa_first_page + pa_sg) * block_tables_strides[1]]) : 0;
for (int page = pa_first_page + pa_sg; page <= pa_last_page; page += NSG) {
  const int64_t block = pa_block;
  if (page + NSG <= pa_last_page) {
    pa_block = block_tables[pa_table_row + int64_t(page + NSG) * block_tables_strides[1]];
  }
  for (int c0 = 0; c0 < TOK; c0 += CHUNK) {
    // Issue every K and V load of the chunk before any math, to keep many bytes in flight.
    T kr[CHUNK][EPL];
    T vr[CHUNK][EPL_V];
    #pragma unroll
    for (int t = 0; t < CHUNK; ++t) {
      const int64_t slot = (c0 + t) * RPW + pa_row;
      #pragma unroll
      for (int j = 0; j < (EPL); ++j) {
        kr[t][j] = k_pages[(block * pa_k_strides[0] + slot * pa_k_strides[1] + pa_k_head) + j];
      }
      #pragma unroll
      for (int j = 0; j < (EPL_V); ++j) {
        vr[t][j] = v_pages[(block * pa_v_strides[0] + slot * pa_v_strides[1] + pa_v_head) + j];
      }
    }
    float s[GQA][CHUNK];
    bool valid[CHUNK];
    #pragma unroll
    for (int t = 0; t < CHUNK; ++t) {
      const int pos = page * BLOCK_SIZE + (c0 + t) * RPW + pa_row;
      valid[t] = pos >= pa_begin && pos < pa_end;
      #pragma unroll
      for (int g = 0; g < GQA; ++g) {
        float acc = 0.0f;
        #pragma unroll
        for (int i = 0; i < EPL; ++i) acc += pa_q[g][i] * static_cast<float>(kr[t][i]);
        s[g][t] = acc;
      }
    }
    // Finish each dot product across the TPR lanes of its row group.
    #pragma unroll
    for (int mask = TPR / 2; mask > 0; mask >>= 1) {
      #pragma unroll
      for (int g = 0; g < GQA; ++g) {
        #pragma unroll
        for (int t = 0; t < CHUNK; ++t) s[g][t] += simd_shuffle_xor(s[g][t], mask);
      }
    }
    // Soft-capped scores, cap * tanh(s / cap), in the exp2 domain the scores are in.
    #pragma unroll
    for (int g = 0; g < GQA; ++g) {
      #pragma unroll
      for (int t = 0; t < CHUNK; ++t) s[g][t] = pa_cap * tanh(s[g][t] / pa_cap);
    }
    // One online-softmax rescale per chunk; masked tokens weigh exactly 0.
    #pragma unroll
    for (int g = 0; g < GQA; ++g) {
      float chunk_max = pa_fmin;
      #pragma unroll
      for (int t = 0; t < CHUNK; ++t) chunk_max = valid[t] ? max(chunk_max, s[g][t]) : chunk_max;
      const float m_new = max(pa_m[g], chunk_max);
      const float corr = fast::exp2(pa_m[g] - m_new);
      pa_m[g] = m_new;
      pa_l[g] *= corr;
      #pragma unroll
      for (int i = 0; i < EPL_V; ++i) pa_o[g][i] *= corr;
      #pragma unroll
      for (int t = 0; t < CHUNK; ++t) {
        s[g][t] = valid[t] ? fast::exp2(s[g][t] - m_new) : 0.0f;
        pa_l[g] += s[g][t];
      }
    }
    #pragma unroll
    for (int t = 0; t < CHUNK; ++t) {
      #pragma unroll
      for (int i = 0; i < EPL_V; ++i) {
        const float v = static_cast<float>(vr[t][i]);
        #pragma unroll
        for (int g = 0; g < GQA; ++g) pa_o[g][i] += s[g][t] * v;
      }
    }
  }
}

// Merge the RPW row groups of this simdgroup (lanes that differ in the row bits).
#pragma unroll
for (int mask = TPR; mask < 32; mask <<= 1) {
  #pragma unroll
  for (int g = 0; g < GQA; ++g) {
    const float m_other = simd_shuffle_xor(pa_m[g], mask);
    const float l_other = simd_shuffle_xor(pa_l[g], mask);
    const float m_new = max(pa_m[g], m_other);
    const float a = fast::exp2(pa_m[g] - m_new);
    const float b = fast::exp2(m_other - m_new);
    pa_m[g] = m_new;
    pa_l[g] = pa_l[g] * a + l_other * b;
    #pragma unroll
    for (int i = 0; i < EPL_V; ++i) {
      const float o_other = simd_shuffle_xor(pa_o[g][i], mask);
      pa_o[g][i] = pa_o[g][i] * a + o_other * b;
    }
  }
}

// Merge the simdgroups through threadgroup memory.
threadgroup float tg_o[NSG][GQA][VALUE_DIM];
threadgroup float tg_m[NSG][GQA];
threadgroup float tg_l[NSG][GQA];
if (pa_row == 0) {
  #pragma unroll
  for (int g = 0; g < GQA; ++g) {
    #pragma unroll
    for (int i = 0; i < EPL_V; ++i) tg_o[pa_sg][g][pa_sub * EPL_V + i] = pa_o[g][i];
    if (pa_sub == 0) {
      tg_m[pa_sg][g] = pa_m[g];
      tg_l[pa_sg][g] = pa_l[g];
    }
  }
}
threadgroup_barrier(mem_flags::mem_threadgroup);
for (int i = pa_tid; i < GQA * VALUE_DIM; i += NSG * 32) {
  const int g = i / VALUE_DIM;
  const int dim = i % VALUE_DIM;
  float m_all = pa_fmin;
  #pragma unroll
  for (int w = 0; w < NSG; ++w) m_all = max(m_all, tg_m[w][g]);
  float l_all = 0.0f;
  float o_all = 0.0f;
  #pragma unroll
  for (int w = 0; w < NSG; ++w) {
    const float f = fast::exp2(tg_m[w][g] - m_all);
    l_all += tg_l[w][g] * f;
    o_all += tg_o[w][g][dim] * f;
  }
  const int64_t row_out = int64_t(pa_seq) * pa_num_kv_heads * GQA + pa_kv_head * GQA + g;
  out[row_out * VALUE_DIM + dim] = static_cast<T>(o_all / l_all);
}

}

template [[host_name("custom_kernel_decode_simt_metal_bf16_hd256_bs16_g2_sw_sc__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_int32_tc_floatc_bfloat16_t")]] [[kernel]] decltype(custom_kernel_decode_simt_metal_bf16_hd256_bs16_g2_sw_sc__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_int32_tc_floatc_bfloat16_t<bfloat16_t>) custom_kernel_decode_simt_metal_bf16_hd256_bs16_g2_sw_sc__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_int32_t_int32_t_floatc_int32_tc_floatc_bfloat16_t<bfloat16_t>;

