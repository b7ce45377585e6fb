// A stand-in for the Metal Shading Language, just enough for clang's C++ front end to type-check
// the kernels MLX generates: MSL's scalar types, address-space qualifiers (as no-ops), the
// builtins our templates call, and what MLX's utils.h provides (bfloat16_t, Limits).
// It checks names, types, overloads and template instantiation; it cannot check address
// spaces, attributes or anything the real Metal compiler does past the front end.
#pragma once

#define device
#define constant
#define threadgroup
#define thread

typedef unsigned int uint;
typedef unsigned short ushort;
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef unsigned long size_t;

struct uint2 { uint x, y; };
struct uint3 { uint x, y, z; };
struct uint4 { uint x, y, z, w; };
struct float4 { float x, y, z, w; };

// 16-bit floats: convert to and from float explicitly or implicitly, as in MSL.
struct half {
  half() = default;
  half(float);
  operator float() const;
};
typedef half float16_t;
struct bfloat16_t {
  bfloat16_t() = default;
  bfloat16_t(float);
  operator float() const;
};

template <typename U> struct Limits;
template <> struct Limits<float> {
  static constexpr constant float max = 3.40282347e38f;
  static constexpr constant float min = 1.17549435e-38f;
  static constexpr constant float finite_max = 3.40282347e38f;
  static constexpr constant float finite_min = -3.40282347e38f;
};

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

// Overloads, not templates: like MSL, max(int, float) is ambiguous and fails to compile.
int max(int, int);
uint max(uint, uint);
float max(float, float);
int min(int, int);
uint min(uint, uint);
float min(float, float);
float exp(float);
float exp2(float);
float log(float);
float log1p(float);  // MLX's utils.h, which MLX puts before every custom kernel
float sqrt(float);
float rsqrt(float);
float tanh(float);
float abs(float);
float round(float);
float fma(float, float, float);

float simd_sum(float);
int simd_sum(int);
float simd_max(float);
int simd_max(int);
float simd_shuffle_xor(float, ushort);
int simd_shuffle_xor(int, ushort);
float simd_shuffle_down(float, ushort);
int simd_shuffle(int, ushort);
float simd_shuffle(float, ushort);
float simd_broadcast(float, ushort);

namespace fast {
float exp(float);
float exp2(float);
float log(float);
float rsqrt(float);
}  // namespace fast

namespace precise {
float cos(float);
float sin(float);
float rsqrt(float);
}  // namespace precise
}  // namespace metal

using namespace metal;
