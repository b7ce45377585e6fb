template <typename T>
[[kernel]] void custom_kernel_swiglu_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t(
  const device bfloat16_t* gate_up [[buffer(0)]],
  const constant int* gate_up_shape [[buffer(1)]],
  device bfloat16_t* out [[buffer(2)]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]],
  uint3 threads_per_threadgroup [[threads_per_threadgroup]]) {
// swiglu_metal_bf16
const int64_t sw_i = int64_t(threadgroup_position_in_grid.x) * threads_per_threadgroup.x + thread_index_in_threadgroup;
const int64_t sw_width = gate_up_shape[1] / 2;
if (sw_i < gate_up_shape[0] * sw_width) {
  const int64_t sw_row = sw_i / sw_width;
  const int64_t sw_col = sw_i % sw_width;
  const T sw_gate = gate_up[sw_row * 2 * sw_width + sw_col];
  const T sw_up = gate_up[sw_row * 2 * sw_width + sw_width + sw_col];
  const float sw_g = static_cast<float>(sw_gate);
  const float sw_y = 1.0f / (1.0f + metal::exp(metal::abs(sw_g)));
  const T sw_sig = static_cast<T>(sw_g < 0.0f ? sw_y : 1.0f - sw_y);
  const T sw_silu = static_cast<T>(sw_g * static_cast<float>(sw_sig));
  out[sw_i] = static_cast<T>(static_cast<float>(sw_silu) * static_cast<float>(sw_up));
}

}

template [[host_name("custom_kernel_swiglu_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t")]] [[kernel]] decltype(custom_kernel_swiglu_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t<bfloat16_t>) custom_kernel_swiglu_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t<bfloat16_t>;

