template <typename T>
[[kernel]] void custom_kernel_gated_delta_metal_bf16_hk16_hv32_dk128_dv128__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float(
  const device bfloat16_t* q [[buffer(0)]],
  const constant int* q_shape [[buffer(1)]],
  const constant int64_t* q_strides [[buffer(2)]],
  const device bfloat16_t* k [[buffer(3)]],
  const constant int64_t* k_strides [[buffer(4)]],
  const device bfloat16_t* v [[buffer(5)]],
  const constant int64_t* v_strides [[buffer(6)]],
  const device float* g [[buffer(7)]],
  const constant int64_t* g_strides [[buffer(8)]],
  const device bfloat16_t* beta [[buffer(9)]],
  const constant int64_t* beta_strides [[buffer(10)]],
  const device float* state [[buffer(11)]],
  const constant int64_t* state_strides [[buffer(12)]],
  device bfloat16_t* y [[buffer(13)]],
  device float* state_out [[buffer(14)]],
  uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {
// gated_delta_metal_bf16_hk16_hv32_dk128_dv128
constexpr int KEY_HEADS = 16;
constexpr int VALUE_HEADS = 32;
constexpr int KEY_DIM = 128;
constexpr int VALUE_DIM = 128;
constexpr int PER_LANE = KEY_DIM / 32;
constexpr int ROWS_PER_GROUP = 4;
const int gd_lane = thread_index_in_simdgroup;
const int gd_row = threadgroup_position_in_grid.x * ROWS_PER_GROUP + simdgroup_index_in_threadgroup;  // value row
const int gd_seq = threadgroup_position_in_grid.y / VALUE_HEADS;
const int gd_vh = threadgroup_position_in_grid.y % VALUE_HEADS;
const int gd_kh = gd_vh / (VALUE_HEADS / KEY_HEADS);  // value heads share key heads in order
const int gd_steps = q_shape[1];
const int gd_first = gd_lane * PER_LANE;  // this lane's first key-axis position

const device T* gd_q = q + gd_seq * q_strides[0] + gd_kh * q_strides[2];
const device T* gd_k = k + gd_seq * k_strides[0] + gd_kh * k_strides[2];
const device T* gd_v = v + gd_seq * v_strides[0] + gd_vh * v_strides[2]
    + gd_row * v_strides[3];
const device float* gd_g = g + gd_seq * g_strides[0] + gd_vh * g_strides[2];
const device T* gd_beta = beta + gd_seq * beta_strides[0] + gd_vh * beta_strides[2];
const int64_t gd_state_at = gd_seq * state_strides[0] + gd_vh * state_strides[1]
    + gd_row * state_strides[2];
const int64_t gd_out_row = (int64_t(gd_seq) * VALUE_HEADS + gd_vh) * VALUE_DIM + gd_row;

float gd_s[PER_LANE];
for (int i = 0; i < PER_LANE; ++i) {
  gd_s[i] = state[gd_state_at + (gd_first + i) * state_strides[3]];
}
for (int t = 0; t < gd_steps; ++t) {
  const float decay = gd_g[t * g_strides[1]];
  const float rate = static_cast<float>(gd_beta[t * beta_strides[1]]);
  float key[PER_LANE];
  for (int i = 0; i < PER_LANE; ++i) {
    key[i] = static_cast<float>(gd_k[t * k_strides[1] + (gd_first + i) * k_strides[3]]);
  }
  float recalled = 0.0f;
  for (int i = 0; i < PER_LANE; ++i) {
    gd_s[i] *= decay;
    recalled += gd_s[i] * key[i];
  }
  recalled += simd_shuffle_xor(recalled, 16);
  recalled += simd_shuffle_xor(recalled, 8);
  recalled += simd_shuffle_xor(recalled, 4);
  recalled += simd_shuffle_xor(recalled, 2);
  recalled += simd_shuffle_xor(recalled, 1);
  const float delta = (static_cast<float>(gd_v[t * v_strides[1]]) - recalled) * rate;
  float out = 0.0f;
  for (int i = 0; i < PER_LANE; ++i) {
    gd_s[i] += key[i] * delta;
    out += gd_s[i] * static_cast<float>(gd_q[t * q_strides[1] + (gd_first + i) * q_strides[3]]);
  }
  out += simd_shuffle_xor(out, 16);
  out += simd_shuffle_xor(out, 8);
  out += simd_shuffle_xor(out, 4);
  out += simd_shuffle_xor(out, 2);
  out += simd_shuffle_xor(out, 1);
  if (gd_lane == 0) {
    y[(int64_t(gd_seq) * gd_steps + t) * VALUE_HEADS * VALUE_DIM
      + int64_t(gd_vh) * VALUE_DIM + gd_row] = static_cast<T>(out);
  }
}
for (int i = 0; i < PER_LANE; ++i) {
  state_out[gd_out_row * KEY_DIM + gd_first + i] = gd_s[i];
}

}

template [[host_name("custom_kernel_gated_delta_metal_bf16_hk16_hv32_dk128_dv128__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float")]] [[kernel]] decltype(custom_kernel_gated_delta_metal_bf16_hk16_hv32_dk128_dv128__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float<bfloat16_t>) custom_kernel_gated_delta_metal_bf16_hk16_hv32_dk128_dv128__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float<bfloat16_t>;

