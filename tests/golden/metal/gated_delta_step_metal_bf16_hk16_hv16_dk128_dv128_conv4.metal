template <typename T>
[[kernel]] void custom_kernel_gated_delta_step_metal_bf16_hk16_hv16_dk128_dv128_conv4__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float_bfloat16_t(
  const device bfloat16_t* qkv [[buffer(0)]],
  const constant int64_t* qkv_strides [[buffer(1)]],
  const device bfloat16_t* conv_state [[buffer(2)]],
  const constant int64_t* conv_state_strides [[buffer(3)]],
  const device bfloat16_t* conv_weight [[buffer(4)]],
  const constant int64_t* conv_weight_strides [[buffer(5)]],
  const device bfloat16_t* a [[buffer(6)]],
  const constant int64_t* a_strides [[buffer(7)]],
  const device bfloat16_t* b [[buffer(8)]],
  const constant int64_t* b_strides [[buffer(9)]],
  const device float* a_log [[buffer(10)]],
  const device bfloat16_t* dt_bias [[buffer(11)]],
  const device float* state [[buffer(12)]],
  const constant int64_t* state_strides [[buffer(13)]],
  device bfloat16_t* y [[buffer(14)]],
  device float* state_out [[buffer(15)]],
  device bfloat16_t* conv_out [[buffer(16)]],
  uint simdgroup_index_in_threadgroup [[simdgroup_index_in_threadgroup]],
  uint thread_index_in_simdgroup [[thread_index_in_simdgroup]],
  uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]) {
// gated_delta_step_metal_bf16_hk16_hv16_dk128_dv128_conv4
constexpr int KEY_HEADS = 16;
constexpr int VALUE_HEADS = 16;
constexpr int KEY_DIM = 128;
constexpr int VALUE_DIM = 128;
constexpr int CONV = 4;
constexpr int KEYS = KEY_HEADS * KEY_DIM;  // channels of q, and of k after them
constexpr int CHANNELS = 2 * KEYS + VALUE_HEADS * VALUE_DIM;
constexpr int PER_LANE = KEY_DIM / 32;
constexpr int ROWS_PER_GROUP = 4;
// mlx-lm's l2 eps (1e-6) on mean(x^2) rather than sum(x^2), and its two scales.
constexpr float QK_NORM_EPS = 7.812500000e-09f;
const int gd_lane = thread_index_in_simdgroup;
const int gd_row = threadgroup_position_in_grid.x * ROWS_PER_GROUP + simdgroup_index_in_threadgroup;  // value row
const int gd_seq = threadgroup_position_in_grid.y / VALUE_HEADS;
const int gd_vh = threadgroup_position_in_grid.y % VALUE_HEADS;
const int gd_group = VALUE_HEADS / KEY_HEADS;
const int gd_kh = gd_vh / gd_group;  // value heads share key heads in order
const int gd_first = gd_lane * PER_LANE;  // this lane's first key-axis position

const device T* gd_qkv = qkv + gd_seq * qkv_strides[0];
const device T* gd_conv = conv_state + gd_seq * conv_state_strides[0];
const int64_t gd_conv_out = int64_t(gd_seq) * (CONV - 1) * CHANNELS;
const int64_t gd_state_at = gd_seq * state_strides[0] + gd_vh * state_strides[1]
    + gd_row * state_strides[2];
const int64_t gd_out_row = (int64_t(gd_seq) * VALUE_HEADS + gd_vh) * VALUE_DIM + gd_row;

float query[PER_LANE];
{
  float sum = 0.0f;
  for (int i = 0; i < PER_LANE; ++i) {
    float x;
    {
      const int64_t c = gd_kh * KEY_DIM + gd_first + i;
      float acc = 0.0f;
      for (int j = 0; j < CONV - 1; ++j) {
        acc += static_cast<float>(gd_conv[j * conv_state_strides[1] + c * conv_state_strides[2]])
            * static_cast<float>(conv_weight[c * conv_weight_strides[0] + j * conv_weight_strides[1]]);
      }
      acc += static_cast<float>(gd_qkv[c * qkv_strides[2]])
          * static_cast<float>(conv_weight[c * conv_weight_strides[0] + (CONV - 1) * conv_weight_strides[1]]);
      const float conv = static_cast<float>(static_cast<T>(acc));
      const float gate = static_cast<float>(static_cast<T>(1.0f / (1.0f + exp(-conv))));
      x = static_cast<float>(static_cast<T>(conv * gate));
    }
    query[i] = x;
    sum += x * x;
  }
  sum += simd_shuffle_xor(sum, 16);
  sum += simd_shuffle_xor(sum, 8);
  sum += simd_shuffle_xor(sum, 4);
  sum += simd_shuffle_xor(sum, 2);
  sum += simd_shuffle_xor(sum, 1);
  const float norm = rsqrt(sum / KEY_DIM + QK_NORM_EPS);
  const float scale = static_cast<float>(static_cast<T>(7.812500000e-03));
  for (int i = 0; i < PER_LANE; ++i) {
    query[i] = static_cast<float>(static_cast<T>(static_cast<float>(static_cast<T>(query[i] * norm)) * scale));
  }
}
float key[PER_LANE];
{
  float sum = 0.0f;
  for (int i = 0; i < PER_LANE; ++i) {
    float x;
    {
      const int64_t c = KEYS + gd_kh * KEY_DIM + gd_first + i;
      float acc = 0.0f;
      for (int j = 0; j < CONV - 1; ++j) {
        acc += static_cast<float>(gd_conv[j * conv_state_strides[1] + c * conv_state_strides[2]])
            * static_cast<float>(conv_weight[c * conv_weight_strides[0] + j * conv_weight_strides[1]]);
      }
      acc += static_cast<float>(gd_qkv[c * qkv_strides[2]])
          * static_cast<float>(conv_weight[c * conv_weight_strides[0] + (CONV - 1) * conv_weight_strides[1]]);
      const float conv = static_cast<float>(static_cast<T>(acc));
      const float gate = static_cast<float>(static_cast<T>(1.0f / (1.0f + exp(-conv))));
      x = static_cast<float>(static_cast<T>(conv * gate));
    }
    key[i] = x;
    sum += x * x;
  }
  sum += simd_shuffle_xor(sum, 16);
  sum += simd_shuffle_xor(sum, 8);
  sum += simd_shuffle_xor(sum, 4);
  sum += simd_shuffle_xor(sum, 2);
  sum += simd_shuffle_xor(sum, 1);
  const float norm = rsqrt(sum / KEY_DIM + QK_NORM_EPS);
  const float scale = static_cast<float>(static_cast<T>(8.838834765e-02));
  for (int i = 0; i < PER_LANE; ++i) {
    key[i] = static_cast<float>(static_cast<T>(static_cast<float>(static_cast<T>(key[i] * norm)) * scale));
  }
}
float value;
{
  const int64_t c = 2 * KEYS + gd_vh * VALUE_DIM + gd_row;
  float acc = 0.0f;
  for (int j = 0; j < CONV - 1; ++j) {
    acc += static_cast<float>(gd_conv[j * conv_state_strides[1] + c * conv_state_strides[2]])
        * static_cast<float>(conv_weight[c * conv_weight_strides[0] + j * conv_weight_strides[1]]);
  }
  acc += static_cast<float>(gd_qkv[c * qkv_strides[2]])
      * static_cast<float>(conv_weight[c * conv_weight_strides[0] + (CONV - 1) * conv_weight_strides[1]]);
  const float conv = static_cast<float>(static_cast<T>(acc));
  const float gate = static_cast<float>(static_cast<T>(1.0f / (1.0f + exp(-conv))));
  value = static_cast<float>(static_cast<T>(conv * gate));
}
// g = exp(-exp(A_log) * softplus(a + dt_bias)) and beta = sigmoid(b), rounded as mlx-lm's ops.
const float gd_a = static_cast<float>(static_cast<T>(
    static_cast<float>(a[gd_seq * a_strides[0] + gd_vh * a_strides[2]])
    + static_cast<float>(dt_bias[gd_vh])));
const float gd_softplus = static_cast<float>(static_cast<T>(
    max(gd_a, 0.0f) + log1p(exp(-abs(gd_a)))));
const float decay = exp(-exp(a_log[gd_vh]) * gd_softplus);
const float rate = static_cast<float>(static_cast<T>(
    1.0f / (1.0f + exp(-static_cast<float>(b[gd_seq * b_strides[0] + gd_vh * b_strides[2]])))));

float gd_s[PER_LANE];
for (int i = 0; i < PER_LANE; ++i) {
  gd_s[i] = state[gd_state_at + (gd_first + i) * state_strides[3]];
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
const float delta = (value - recalled) * rate;
float out = 0.0f;
for (int i = 0; i < PER_LANE; ++i) {
  gd_s[i] += key[i] * delta;
  out += gd_s[i] * query[i];
}
out += simd_shuffle_xor(out, 16);
out += simd_shuffle_xor(out, 8);
out += simd_shuffle_xor(out, 4);
out += simd_shuffle_xor(out, 2);
out += simd_shuffle_xor(out, 1);
if (gd_lane == 0) {
  y[gd_out_row] = static_cast<T>(out);
}
for (int i = 0; i < PER_LANE; ++i) {
  state_out[gd_out_row * KEY_DIM + gd_first + i] = gd_s[i];
}
// The first value row of each key head's first value head writes the q and k channels.
if (gd_row == 0 && gd_vh % gd_group == 0) {
  for (int i = 0; i < PER_LANE; ++i) {
    {
      const int64_t c = gd_kh * KEY_DIM + gd_first + i;
      for (int j = 0; j < CONV - 2; ++j) {
        conv_out[gd_conv_out + j * CHANNELS + c] = gd_conv[(j + 1) * conv_state_strides[1] + c * conv_state_strides[2]];
      }
      conv_out[gd_conv_out + (CONV - 2) * CHANNELS + c] = gd_qkv[c * qkv_strides[2]];
    }
    {
      const int64_t c = KEYS + gd_kh * KEY_DIM + gd_first + i;
      for (int j = 0; j < CONV - 2; ++j) {
        conv_out[gd_conv_out + j * CHANNELS + c] = gd_conv[(j + 1) * conv_state_strides[1] + c * conv_state_strides[2]];
      }
      conv_out[gd_conv_out + (CONV - 2) * CHANNELS + c] = gd_qkv[c * qkv_strides[2]];
    }
  }
}
if (gd_lane == 0) {
  {
    const int64_t c = 2 * KEYS + gd_vh * VALUE_DIM + gd_row;
    for (int j = 0; j < CONV - 2; ++j) {
      conv_out[gd_conv_out + j * CHANNELS + c] = gd_conv[(j + 1) * conv_state_strides[1] + c * conv_state_strides[2]];
    }
    conv_out[gd_conv_out + (CONV - 2) * CHANNELS + c] = gd_qkv[c * qkv_strides[2]];
  }
}

}

template [[host_name("custom_kernel_gated_delta_step_metal_bf16_hk16_hv16_dk128_dv128_conv4__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float_bfloat16_t")]] [[kernel]] decltype(custom_kernel_gated_delta_step_metal_bf16_hk16_hv16_dk128_dv128_conv4__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float_bfloat16_t<bfloat16_t>) custom_kernel_gated_delta_step_metal_bf16_hk16_hv16_dk128_dv128_conv4__bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_bfloat16_t_float_bfloat16_t_float_bfloat16_t_float_bfloat16_t<bfloat16_t>;

