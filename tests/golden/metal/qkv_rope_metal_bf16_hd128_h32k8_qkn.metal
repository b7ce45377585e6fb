template <typename T>
[[kernel]] void custom_kernel_qkv_rope_metal_bf16_hd128_h32k8_qkn__bfloat16_t_bfloat16_t_int32_t_float_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t_bfloat16_t(
  const device bfloat16_t* qkv [[buffer(0)]],
  const device int32_t* positions [[buffer(1)]],
  const device float* rope_inv_freq [[buffer(2)]],
  const constant int* rope_inv_freq_shape [[buffer(3)]],
  const device bfloat16_t* q_norm [[buffer(4)]],
  const device bfloat16_t* k_norm [[buffer(5)]],
  const constant float* eps [[buffer(6)]],
  device bfloat16_t* queries [[buffer(7)]],
  device bfloat16_t* keys [[buffer(8)]],
  device bfloat16_t* values [[buffer(9)]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {
// qkv_rope_metal_bf16_hd128_h32k8_qkn
constexpr int HEAD_DIM = 128;
constexpr int HEADS = 32;
constexpr int KV_HEADS = 8;
constexpr int ALL_HEADS = HEADS + 2 * KV_HEADS;
const int64_t qr_unit = threadgroup_position_in_grid.x;
const int64_t qr_row = qr_unit / ALL_HEADS;
const int qr_head = int(qr_unit % ALL_HEADS);
const int qr_lane = thread_index_in_threadgroup;
const device T* qr_x = qkv + qr_unit * HEAD_DIM;
const int64_t qr_kv_row = qr_row;
if (qr_head >= HEADS + KV_HEADS) {
  device T* qr_dst = values + (qr_kv_row * KV_HEADS + (qr_head - HEADS - KV_HEADS)) * HEAD_DIM;
  for (int dim = qr_lane; dim < HEAD_DIM; dim += 32) qr_dst[dim] = qr_x[dim];
} else {
  const bool qr_is_query = qr_head < HEADS;
  const device T* qr_w = qr_is_query ? q_norm : k_norm;
  float qr_acc = 0.0f;
  for (int dim = qr_lane; dim < HEAD_DIM; dim += 32) {
    const float xv = static_cast<float>(qr_x[dim]);
    qr_acc += xv * xv;
  }
  qr_acc = simd_sum(qr_acc);
  const float qr_scale = precise::rsqrt(qr_acc / HEAD_DIM + eps[0]);
  device T* qr_dst = qr_is_query
      ? queries + (qr_row * HEADS + qr_head) * HEAD_DIM
      : keys + (qr_kv_row * KV_HEADS + (qr_head - HEADS)) * HEAD_DIM;
  const float qr_pos = static_cast<float>(positions[qr_row]);
  const int qr_half = rope_inv_freq_shape[0];
  for (int dim = qr_lane; dim < HEAD_DIM; dim += 32) {
    const float xd = static_cast<float>(static_cast<T>(static_cast<float>(qr_w[dim]) * static_cast<float>(static_cast<T>(static_cast<float>(qr_x[dim]) * qr_scale))));
    float rotated = xd;
    if (dim < 2 * qr_half) {
      const bool low = dim < qr_half;
      const int pair = low ? dim + qr_half : dim - qr_half;
      const float xp = static_cast<float>(static_cast<T>(static_cast<float>(qr_w[pair]) * static_cast<float>(static_cast<T>(static_cast<float>(qr_x[pair]) * qr_scale))));
      const float angle = qr_pos * rope_inv_freq[low ? dim : pair];
      const float c = precise::cos(angle);
      const float s = precise::sin(angle);
      rotated = low ? xd * c - xp * s : xp * s + xd * c;
    }
    qr_dst[dim] = static_cast<T>(rotated);
  }
}

}

template [[host_name("custom_kernel_qkv_rope_metal_bf16_hd128_h32k8_qkn__bfloat16_t_bfloat16_t_int32_t_float_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t_bfloat16_t")]] [[kernel]] decltype(custom_kernel_qkv_rope_metal_bf16_hd128_h32k8_qkn__bfloat16_t_bfloat16_t_int32_t_float_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t_bfloat16_t<bfloat16_t>) custom_kernel_qkv_rope_metal_bf16_hd128_h32k8_qkn__bfloat16_t_bfloat16_t_int32_t_float_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t_bfloat16_t<bfloat16_t>;

