template <typename T>
[[kernel]] void custom_kernel_quantize_rows_metal_bf16_hd128_k4v4gs32__bfloat16_t_bfloat16_t_bfloat16_t_uint32_t(
  const device bfloat16_t* keys [[buffer(0)]],
  const constant int* keys_shape [[buffer(1)]],
  const constant int64_t* keys_strides [[buffer(2)]],
  const device bfloat16_t* values [[buffer(3)]],
  const constant int64_t* values_strides [[buffer(4)]],
  device uint32_t* rows [[buffer(5)]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {
// quantize_rows_metal_bf16_hd128_k4v4gs32
constexpr int HEAD_DIM = 128;
constexpr int GROUP = 32;
constexpr int GROUPS = HEAD_DIM / GROUP;
constexpr int ROW_WORDS = 40;
const int qr_row = threadgroup_position_in_grid.x;  // token n, KV head h: n * heads + h
const int qr_lane = thread_index_in_threadgroup;
const int qr_heads = keys_shape[1];
const int64_t qr_n = qr_row / qr_heads;
const int64_t qr_h = qr_row % qr_heads;
device uint32_t* qr_out = rows + int64_t(qr_row) * ROW_WORDS;
const int qr_group = qr_lane % GROUPS;
if (qr_lane < GROUPS) {
  const device T* qr_x = keys + qr_n * keys_strides[0] + qr_h * keys_strides[1];
  const int64_t qr_x_step = keys_strides[2];
  float w[GROUP];
  float lo = 3.402823466e+38f;
  float hi = -3.402823466e+38f;
  for (int i = 0; i < GROUP; ++i) {
    w[i] = static_cast<float>(qr_x[int64_t(qr_group * GROUP + i) * qr_x_step]);
    lo = min(lo, w[i]);
    hi = max(hi, w[i]);
  }
  const float n_bins = 15.0f;
  float scale = max((hi - lo) / n_bins, 1e-7f);
  const bool lo_edge = abs(lo) > abs(hi);
  scale = lo_edge ? scale : -scale;
  const float edge = lo_edge ? lo : hi;
  const float q0 = round(edge / scale);
  const bool at_zero = q0 == 0.0f;
  scale = at_zero ? scale : edge / q0;
  const float bias = at_zero ? 0.0f : edge;
  reinterpret_cast<device T*>(qr_out)[64 + qr_group] = static_cast<T>(scale);
  reinterpret_cast<device T*>(qr_out)[68 + qr_group] = static_cast<T>(bias);
  // Values from the low bits of each word up.
  for (int j = 0; j < GROUP * 4 / 32; ++j) {
    uint32_t word = 0;
    for (int k = 0; k < 8; ++k) {
      const float q = min(round((w[j * 8 + k] - bias) / scale), n_bins);
      word |= uint32_t(q) << (4 * k);
    }
    qr_out[0 + qr_group * (GROUP * 4 / 32) + j] = word;
  }

} else if (qr_lane < 2 * GROUPS) {
  const device T* qr_x = values + qr_n * values_strides[0] + qr_h * values_strides[1];
  const int64_t qr_x_step = values_strides[2];
  float w[GROUP];
  float lo = 3.402823466e+38f;
  float hi = -3.402823466e+38f;
  for (int i = 0; i < GROUP; ++i) {
    w[i] = static_cast<float>(qr_x[int64_t(qr_group * GROUP + i) * qr_x_step]);
    lo = min(lo, w[i]);
    hi = max(hi, w[i]);
  }
  const float n_bins = 15.0f;
  float scale = max((hi - lo) / n_bins, 1e-7f);
  const bool lo_edge = abs(lo) > abs(hi);
  scale = lo_edge ? scale : -scale;
  const float edge = lo_edge ? lo : hi;
  const float q0 = round(edge / scale);
  const bool at_zero = q0 == 0.0f;
  scale = at_zero ? scale : edge / q0;
  const float bias = at_zero ? 0.0f : edge;
  reinterpret_cast<device T*>(qr_out)[72 + qr_group] = static_cast<T>(scale);
  reinterpret_cast<device T*>(qr_out)[76 + qr_group] = static_cast<T>(bias);
  // Values from the low bits of each word up.
  for (int j = 0; j < GROUP * 4 / 32; ++j) {
    uint32_t word = 0;
    for (int k = 0; k < 8; ++k) {
      const float q = min(round((w[j * 8 + k] - bias) / scale), n_bins);
      word |= uint32_t(q) << (4 * k);
    }
    qr_out[16 + qr_group * (GROUP * 4 / 32) + j] = word;
  }

}

}

template [[host_name("custom_kernel_quantize_rows_metal_bf16_hd128_k4v4gs32__bfloat16_t_bfloat16_t_bfloat16_t_uint32_t")]] [[kernel]] decltype(custom_kernel_quantize_rows_metal_bf16_hd128_k4v4gs32__bfloat16_t_bfloat16_t_bfloat16_t_uint32_t<bfloat16_t>) custom_kernel_quantize_rows_metal_bf16_hd128_k4v4gs32__bfloat16_t_bfloat16_t_bfloat16_t_uint32_t<bfloat16_t>;

