// The decoder stack of a quantised float32 model for a step of output feeds (a decode, a
// handoff's suffix: each row one token, attending to its causal prefix's slots), in one
// call from Python instead of ~30 per layer
// (trd/models/native_stack.py). Each operation is the very call the model's modules make
// on that path (trd/models/model.py with `native` set): RMSNorm, the quantised linears,
// rotation, the KV write, one-token attention, SiLU * up, the residual adds, in the same
// order on the same numbers, so a row's hidden state is bit for bit what the modules give,
// whichever way its step went.

#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

extern "C" {

struct TrdLinear {  // one quantised weight (trd/models/qformat.py's tiles)
  const uint8_t* qweight;
  const uint16_t* scales;
  const uint16_t* mins;  // NULL for 8 bits
  const float* bias;     // or NULL
  int32_t bits, out_features;
};

struct TrdLayer {
  const float* input_norm;
  const float* post_norm;
  TrdLinear qkv[3];  // q, k, v side by side: one fused weight, or three
  int32_t qkv_parts;
  TrdLinear o;
  TrdLinear gate_up[2];  // gate, up: one fused weight, or two
  int32_t gate_up_parts;
  TrdLinear down;
  float* k_cache;  // (slots, KVH, D)
  float* v_cache;
};

struct TrdShape {
  int32_t hidden, heads, kv_heads, head_dim, intermediate;
  float eps;
};

}  // extern "C"

namespace {

int linear(const TrdLinear& w, const float* x, int T, int K, float* out, int ldc, int add,
           int threads) {
  return trd_qlinear_into(x, 0, T, K, w.out_features, w.bits, w.qweight, w.scales, w.mins,
                          w.bias, out, ldc, 0, add, threads);
}

// Parts side by side in out's rows (ldc floats apart), as one fused weight computes them.
int linears(const TrdLinear* parts, int n, const float* x, int T, int K, float* out, int ldc,
            int threads) {
  int col = 0;
  for (int p = 0; p < n; ++p) {
    if (linear(parts[p], x, T, K, out + col, ldc, 0, threads)) return -1;
    col += parts[p].out_features;
  }
  return 0;
}

}  // namespace

extern "C" {

// x (T, hidden) float32: in, the embeddings; out, the last layer's output (before the final
// norm). Row t is one new token at the position whose rotation cos[t], sin[t] (T, D) hold;
// its k and v go to slot write_slots[t], and it attends to slots[offsets[t]:offsets[t+1]]
// (rows: 0 .. T-1, as trd_decode_attention takes them). Returns 0, or -1 if memory ran out.
int trd_decode_stack(const TrdLayer* layers, int L, const TrdShape* s, float* x, int T,
                     const float* cos, const float* sin, const int64_t* write_slots,
                     const int64_t* rows, const int64_t* offsets, const int64_t* slots,
                     int threads) {
  const int Hd = s->heads * s->head_dim, KVd = s->kv_heads * s->head_dim;
  const int W = Hd + 2 * KVd, I = s->intermediate, hidden = s->hidden;
  const size_t width = static_cast<size_t>(hidden) + W + Hd + 2 * I + I;
  float* work = static_cast<float*>(malloc(sizeof(float) * width * T));
  if (!work) return -1;
  float* xn = work;                              // (T, hidden) normed
  float* qkv = xn + static_cast<size_t>(T) * hidden;  // (T, W)
  float* att = qkv + static_cast<size_t>(T) * W;      // (T, H, D)
  float* gu = att + static_cast<size_t>(T) * Hd;      // (T, 2I)
  float* act = gu + static_cast<size_t>(T) * 2 * I;   // (T, I)
  int err = 0;
  for (int l = 0; l < L && !err; ++l) {
    const TrdLayer& y = layers[l];
    trd_rmsnorm(x, y.input_norm, s->eps, xn, T, hidden);
    err |= linears(y.qkv, y.qkv_parts, xn, T, hidden, qkv, W, threads);
    trd_rope(qkv, T, W, s->heads + s->kv_heads, s->head_dim, cos, sin);
    for (int t = 0; t < T; ++t) {
      const size_t slot = static_cast<size_t>(write_slots[t]) * KVd;
      memcpy(y.k_cache + slot, qkv + static_cast<size_t>(t) * W + Hd, sizeof(float) * KVd);
      memcpy(y.v_cache + slot, qkv + static_cast<size_t>(t) * W + Hd + KVd, sizeof(float) * KVd);
    }
    trd_decode_attention(qkv, W, y.k_cache, y.v_cache, att, T, rows, offsets, slots, s->heads,
                         s->kv_heads, s->head_dim, threads);
    err |= linear(y.o, att, T, Hd, x, hidden, 1, threads);
    trd_rmsnorm(x, y.post_norm, s->eps, xn, T, hidden);
    err |= linears(y.gate_up, y.gate_up_parts, xn, T, hidden, gu, 2 * I, threads);
    trd_silu_mul(gu, gu + I, 2 * I, act, T, I);
    err |= linear(y.down, act, T, I, x, hidden, 1, threads);
  }
  free(work);
  return err ? -1 : 0;
}

}  // extern "C"
