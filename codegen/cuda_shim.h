// What MLX's CUDA custom-kernel wrapper provides around a body (mlx/backend/cuda/device/
// utils.cuh and custom_kernel.cpp), just enough for NVRTC to compile our kernels on a machine
// without MLX's CUDA build or a GPU: fp16/bf16 types, Shape/Strides and Limits.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef int int32_t;
typedef long long int64_t;
typedef unsigned int uint32_t;

struct Shape {
  int32_t v[10];
  __device__ const int32_t& operator[](int i) const { return v[i]; }
};
struct Strides {
  int64_t v[10];
  __device__ const int64_t& operator[](int i) const { return v[i]; }
};

template <typename U> struct Limits;
template <> struct Limits<float> {
  __device__ static constexpr float finite_min() { return -3.40282347e38f; }
  __device__ static constexpr float finite_max() { return 3.40282347e38f; }
};
