// The entry points of the native library (qkernel.cpp, cpu_ops.cpp, cpu_stack.cpp) that
// its files call across one another; Python reaches all of them through ctypes
// (trd/models/qkernel.py).

#pragma once

#include <stdint.h>

extern "C" {

// out (M, N; rows ldc apart) = x (M, K) W^T + bias, or out += that with `add` (float32
// out only). Returns 0, or -1 if memory ran out.
int trd_qlinear_into(const void* x, int x_bf16, int M, int K, int N, int bits,
                     const uint8_t* qw, const uint16_t* scales, const uint16_t* mins,
                     const float* bias, void* out, int ldc, int out_bf16, int add, int threads);
void trd_rmsnorm(const float* x, const float* w, float eps, float* out, int T, int D);
void trd_rope(float* x, int T, int stride, int heads, int D, const float* cos, const float* sin);
void trd_silu_mul(const float* gate, const float* up, int ld, float* out, int T, int I);
void trd_decode_attention(const float* q, int q_stride, const float* k, const float* v,
                          float* out, int n, const int64_t* rows, const int64_t* offsets,
                          const int64_t* slots, int H, int KVH, int D, int threads);
}
