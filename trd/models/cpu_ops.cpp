// The float32 glue of a quantised model's step on the CPU, one call each instead of the
// 5-12 torch calls (each a few microseconds of dispatch at one row) they replace:
// RMSNorm, rotary embedding in place, SiLU(gate) * up, and attention of single-token
// queries over the paged KV cache. Built into the same library as qkernel.cpp
// (trd/models/qkernel.py); cpu_stack.cpp strings them into a whole decode step.

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <vector>

#include "cpu_kernels.h"

namespace {

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// Four accumulators: one chain of dependent FMAs would wait on each one's latency.
inline float dot(const float* a, const float* b, int n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int i = 0;
  for (; i + 32 <= n; i += 32)
    for (int j = 0; j < 4; ++j)
      acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * j), _mm256_loadu_ps(b + i + 8 * j), acc[j]);
  for (int j = 0; i + 8 <= n; i += 8, j = (j + 1) % 4)
    acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc[j]);
  float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// exp of 8 floats: x = n ln2 + r, |r| <= ln2 / 2, e^r by its degree-6 Taylor polynomial
// (relative error < 2e-7 over the range softmax uses, x <= 0), 2^n into the exponent.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));  // below: 0 in float32 anyway
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);
  __m256 e = _mm256_set1_ps(1.0f / 720);
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 120));
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 24));
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f / 6));
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(0.5f));
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
  e = _mm256_fmadd_ps(e, r, _mm256_set1_ps(1.0f));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
}

// p[0:len] = exp(p - max) / sum, in place.
inline void softmax(float* p, int64_t len) {
  float best = -INFINITY;
  for (int64_t l = 0; l < len; ++l) best = p[l] > best ? p[l] : best;
  const __m256 m = _mm256_set1_ps(best);
  __m256 acc = _mm256_setzero_ps();
  int64_t l = 0;
  for (; l + 8 <= len; l += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p + l), m));
    _mm256_storeu_ps(p + l, e);
    acc = _mm256_add_ps(acc, e);
  }
  float total = hsum8(acc);
  for (; l < len; ++l) total += (p[l] = expf(p[l] - best));
  const float inv = 1.0f / total;
  for (l = 0; l < len; ++l) p[l] *= inv;
}

// og[h] (D floats) = sum over l < len of p[h * len + l] * (V row slots[l], from v), for NB
// heads at once: each 8-float chunk of a V row is loaded once, its NB products accumulate
// in registers.
template <int NB>
void weigh_values(const float* p, int64_t len, const float* v, const int64_t* slots,
                  size_t stride, int D, float* og) {
  int c = 0;
  for (; c + 8 <= D; c += 8) {
    __m256 acc[NB];
    for (int h = 0; h < NB; ++h) acc[h] = _mm256_setzero_ps();
    for (int64_t l = 0; l < len; ++l) {
      const __m256 vr = _mm256_loadu_ps(v + slots[l] * stride + c);
      for (int h = 0; h < NB; ++h) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(p[h * len + l]), vr, acc[h]);
    }
    for (int h = 0; h < NB; ++h) _mm256_storeu_ps(og + h * D + c, acc[h]);
  }
  for (; c < D; ++c)  // a head size that is no multiple of 8
    for (int h = 0; h < NB; ++h) {
      float sum = 0;
      for (int64_t l = 0; l < len; ++l) sum += p[h * len + l] * v[slots[l] * stride + c];
      og[h * D + c] = sum;
    }
}

void weigh(int nb, const float* p, int64_t len, const float* v, const int64_t* slots,
           size_t stride, int D, float* og) {
  switch (nb) {
    case 1: return weigh_values<1>(p, len, v, slots, stride, D, og);
    case 2: return weigh_values<2>(p, len, v, slots, stride, D, og);
    case 3: return weigh_values<3>(p, len, v, slots, stride, D, og);
    case 4: return weigh_values<4>(p, len, v, slots, stride, D, og);
    case 5: return weigh_values<5>(p, len, v, slots, stride, D, og);
    case 6: return weigh_values<6>(p, len, v, slots, stride, D, og);
    case 7: return weigh_values<7>(p, len, v, slots, stride, D, og);
    default: return weigh_values<8>(p, len, v, slots, stride, D, og);
  }
}

}  // namespace

extern "C" {

// out (T, D) = x / sqrt(mean(x^2) + eps) * w, per row.
void trd_rmsnorm(const float* x, const float* w, float eps, float* out, int T, int D) {
  for (int t = 0; t < T; ++t) {
    const float* r = x + static_cast<size_t>(t) * D;
    const float inv = 1.0f / sqrtf(dot(r, r, D) / D + eps);
    float* o = out + static_cast<size_t>(t) * D;
    for (int i = 0; i < D; ++i) o[i] = r[i] * inv * w[i];
  }
}

// In place on `heads` heads of D per token (token rows `stride` floats apart): x * cos +
// [x2, x1] * sin, with sin's first half negated by the caller (cos, sin: (T, D)).
void trd_rope(float* x, int T, int stride, int heads, int D, const float* cos, const float* sin) {
  const int half = D / 2;
  std::vector<float> tmp(D);
  for (int t = 0; t < T; ++t) {
    const float* c = cos + static_cast<size_t>(t) * D;
    const float* s = sin + static_cast<size_t>(t) * D;
    for (int h = 0; h < heads; ++h) {
      float* v = x + static_cast<size_t>(t) * stride + static_cast<size_t>(h) * D;
      for (int i = 0; i < half; ++i) {
        tmp[i] = v[i] * c[i] + v[i + half] * s[i];
        tmp[i + half] = v[i + half] * c[i + half] + v[i] * s[i + half];
      }
      memcpy(v, tmp.data(), sizeof(float) * D);
    }
  }
}

// out (T, I) = silu(gate) * up = gate / (1 + e^-gate) * up; row t of gate and up at t * ld.
void trd_silu_mul(const float* gate, const float* up, int ld, float* out, int T, int I) {
  const __m256 one = _mm256_set1_ps(1.0f), cap = _mm256_set1_ps(88.0f);  // e^88 < FLT_MAX
  for (int t = 0; t < T; ++t) {
    const float* g = gate + static_cast<size_t>(t) * ld;
    const float* u = up + static_cast<size_t>(t) * ld;
    float* o = out + static_cast<size_t>(t) * I;
    int i = 0;
    for (; i + 8 <= I; i += 8) {
      const __m256 x = _mm256_loadu_ps(g + i);
      const __m256 e = exp8(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), x), cap));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)),
                                            _mm256_loadu_ps(u + i)));
    }
    for (; i < I; ++i) o[i] = g[i] / (1.0f + expf(fminf(-g[i], 88.0f))) * u[i];
  }
}

// Single-token queries: row r's query q[rows[r]] (H, D; query rows `q_stride` floats apart)
// attends over the KV slots slots[offsets[r] .. offsets[r + 1]) of k and v (slot, KVH, D),
// softmax(q k / sqrt(D)) v into out[rows[r]] (H, D, contiguous). The H / KVH query heads
// of a KV head are done together, so each K and V row is read from memory once.
void trd_decode_attention(const float* q, int q_stride, const float* k, const float* v,
                          float* out, int n, const int64_t* rows, const int64_t* offsets,
                          const int64_t* slots, int H, int KVH, int D, int threads) {
  const int group = H / KVH;
  const float scale = 1.0f / sqrtf(static_cast<float>(D));
  const size_t stride = static_cast<size_t>(KVH) * D;
#pragma omp parallel for collapse(2) num_threads(threads) schedule(static) if (n * KVH > 1)
  for (int r = 0; r < n; ++r) {
    for (int g = 0; g < KVH; ++g) {
      const int64_t begin = offsets[r], len = offsets[r + 1] - offsets[r];
      const float* qg = q + rows[r] * q_stride + static_cast<size_t>(g) * group * D;
      float* og = out + (rows[r] * H + static_cast<size_t>(g) * group) * D;
      std::vector<float> p(static_cast<size_t>(group) * len);  // (head, position)
      for (int64_t l = 0; l < len; ++l) {
        const float* kr = k + slots[begin + l] * stride + static_cast<size_t>(g) * D;
        for (int h = 0; h < group; ++h) p[h * len + l] = dot(qg + h * D, kr, D) * scale;
      }
      for (int h = 0; h < group; ++h) softmax(p.data() + h * len, len);
      for (int h = 0; h < group; h += 8)  // 8 heads of the group at a time
        weigh(group - h < 8 ? group - h : 8, p.data() + h * len, len,
              v + static_cast<size_t>(g) * D, slots + begin, stride, D, og + h * D);
    }
  }
}

}  // extern "C"
