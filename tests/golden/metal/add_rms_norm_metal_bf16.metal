template <typename T>
[[kernel]] void custom_kernel_add_rms_norm_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t(
  const device bfloat16_t* h [[buffer(0)]],
  const constant int* h_shape [[buffer(1)]],
  const device bfloat16_t* r [[buffer(2)]],
  const device bfloat16_t* w [[buffer(3)]],
  const constant float* eps [[buffer(4)]],
  device bfloat16_t* total [[buffer(5)]],
  device bfloat16_t* normed [[buffer(6)]],
  uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {
// add_rms_norm_metal_bf16
constexpr int THREADS = 256;
const int64_t an_row = threadgroup_position_in_grid.x;
const int an_tid = thread_index_in_threadgroup;
const int an_dim = h_shape[1];
const int64_t an_base = an_row * an_dim;
float an_acc = 0.0f;
for (int i = an_tid; i < an_dim; i += THREADS) {
  const T s = static_cast<T>(static_cast<float>(h[an_base + i]) + static_cast<float>(r[an_base + i]));
  total[an_base + i] = s;
  const float sf = static_cast<float>(s);
  an_acc += sf * sf;
}
an_acc = simd_sum(an_acc);
threadgroup float an_sums[THREADS / 32];
if (thread_index_in_simdgroup == 0) an_sums[simdgroup_index_in_threadgroup] = an_acc;
threadgroup_barrier(mem_flags::mem_threadgroup);
// Every thread sums the simdgroups' parts in the same order, so all get the same scale.
float an_sum = 0.0f;
for (int i = 0; i < THREADS / 32; ++i) an_sum += an_sums[i];
const float an_scale = precise::rsqrt(an_sum / an_dim + eps[0]);
for (int i = an_tid; i < an_dim; i += THREADS) {
  const T s = static_cast<T>(static_cast<float>(h[an_base + i]) + static_cast<float>(r[an_base + i]));
  const T n = static_cast<T>(static_cast<float>(s) * an_scale);
  normed[an_base + i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(n));
}

}

template [[host_name("custom_kernel_add_rms_norm_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t")]] [[kernel]] decltype(custom_kernel_add_rms_norm_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t<bfloat16_t>) custom_kernel_add_rms_norm_metal_bf16__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_floatc_bfloat16_t_bfloat16_t<bfloat16_t>;

