template <typename T>
[[kernel]] void custom_kernel_latent_reduce_metal_bf16_r512_p64_bs16__bfloat16_t_float_float_float_int32_t_bfloat16_t(
  const device float* partial_out [[buffer(0)]],
  const device float* partial_max [[buffer(1)]],
  const constant int* partial_max_shape [[buffer(2)]],
  const device float* partial_sum [[buffer(3)]],
  const device int32_t* seq_lens [[buffer(4)]],
  device bfloat16_t* out [[buffer(5)]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint thread_index_in_threadgroup [[thread_index_in_threadgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]],
  uint3 threadgroups_per_grid [[threadgroups_per_grid]],
  uint3 threads_per_threadgroup [[threads_per_threadgroup]]) {
// latent_reduce_metal_bf16_r512_p64_bs16
constexpr int VALUE_DIM = 512;  // V's head size: each output row's
constexpr int PARTITION = 512;
const float pr_fmin = Limits<float>::finite_min;

const int pr_head = threadgroup_position_in_grid.x;
const int pr_seq = threadgroup_position_in_grid.y;
const int pr_num_heads = threadgroups_per_grid.x;
const int pr_lane = thread_index_in_simdgroup;
const int pr_num_parts = partial_max_shape[2];
const int pr_len = seq_lens[pr_seq];
const int64_t pr_row = int64_t(pr_seq) * pr_num_heads + pr_head;
const int64_t pr_base = pr_row * pr_num_parts;

int pr_first = 0;
const int pr_last = (pr_len - 1) / PARTITION;

float pr_max = pr_fmin;
for (int p = pr_first + pr_lane; p <= pr_last; p += 32) pr_max = max(pr_max, partial_max[pr_base + p]);
pr_max = simd_max(pr_max);
float pr_sum = 0.0f;
for (int p = pr_first + pr_lane; p <= pr_last; p += 32) {
  pr_sum += partial_sum[pr_base + p] * fast::exp2(partial_max[pr_base + p] - pr_max);
}
pr_sum = simd_sum(pr_sum);
const float pr_inv = pr_sum > 0.0f ? 1.0f / pr_sum : 0.0f;

for (int dim = 4 * thread_index_in_threadgroup; dim < VALUE_DIM; dim += 4 * threads_per_threadgroup.x) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int p = pr_first; p <= pr_last; ++p) {
    const float w = fast::exp2(partial_max[pr_base + p] - pr_max);
    const float4 x = *reinterpret_cast<const device float4*>(partial_out + (pr_base + p) * VALUE_DIM + dim);
    acc[0] += w * x.x;
    acc[1] += w * x.y;
    acc[2] += w * x.z;
    acc[3] += w * x.w;
  }
  for (int i = 0; i < 4; ++i) out[pr_row * VALUE_DIM + dim + i] = static_cast<T>(acc[i] * pr_inv);
}

}

template [[host_name("custom_kernel_latent_reduce_metal_bf16_r512_p64_bs16__bfloat16_t_float_float_float_int32_t_bfloat16_t")]] [[kernel]] decltype(custom_kernel_latent_reduce_metal_bf16_r512_p64_bs16__bfloat16_t_float_float_float_int32_t_bfloat16_t<bfloat16_t>) custom_kernel_latent_reduce_metal_bf16_r512_p64_bs16__bfloat16_t_float_float_float_int32_t_bfloat16_t<bfloat16_t>;

