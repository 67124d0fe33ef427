// Quantised linear layers on x86 CPUs with AVX2: y = x W^T + b, W stored in 4 or 8 bits.
//
// Built on first use by trd/models/qkernel.py (g++ -O3 -mavx2 -mfma -mf16c -fopenmp) and
// called through ctypes. OpenMP resolves to the libgomp torch already loaded, so the
// kernel shares torch's thread pool and thread count.
//
// Weights, per group of 32 input columns of one output row:
//   4 bits: w = s * q - m, q in 0..15 (asymmetric: llama.cpp's Q4_K blocks exactly)
//   8 bits: w = s * q,     q in -127..127 (symmetric: Q8_0 exactly)
// s and m are float16. Rows are interleaved in tiles of 8 so that one 32-byte load holds
// 8 rows x 8 columns (4 bits: byte 4j+t = q[j][8b+t] | q[j][8b+4+t] << 4) or 8 rows x 4
// columns (8 bits: byte 4j+t = q[j][4b+t]), and each of the 8 int32 lanes accumulates one
// output row: no horizontal sums in the inner loop.
//
// Activations are quantised per row and group of 32 to int8 (d = max|x| / 127,
// q = round-half-even(x / d)), so a row's result never depends on the other rows of the
// batch. Products use vpmaddubsw (unsigned x signed bytes -> int16 pairs): 4-bit weights
// (<= 15) times |x| <= 127 cannot saturate, summed over a whole group (8 * 3810 < 32767);
// 8-bit weights take the sign of x (vpsignb) against |x|, 127 * 127 * 2 < 32767; with VNNI
// they are read as w + 128 (unsigned) and 128 * sum(q) comes off the exact int32 sum.

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

namespace {

constexpr int GROUP = 32;
constexpr int TILE = 8;     // output rows per tile
constexpr int ROWS = 4;     // activation rows per pass over a tile
constexpr int M_BLOCK = 32; // activation rows whose int8 copy stays in L2 across tiles

inline __m256 load8(const void* x, int bf16, size_t off) {
  if (bf16) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(a), 16));
  }
  return _mm256_loadu_ps(static_cast<const float*>(x) + off);
}

// out[off:off + 8] = v, or += v with `add` (float32 only: the caller checks).
inline void store8(void* out, int bf16, int add, size_t off, __m256 v) {
  if (!bf16) {
    float* o = static_cast<float*>(out) + off;
    _mm256_storeu_ps(o, add ? _mm256_add_ps(_mm256_loadu_ps(o), v) : v);
    return;
  }
  __m256i i = _mm256_castps_si256(v);  // round to nearest even, as torch's .to(bfloat16)
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(i, 16), _mm256_set1_epi32(1));
  i = _mm256_add_epi32(i, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  i = _mm256_srli_epi32(i, 16);
  __m128i p = _mm_packus_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + off), p);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// Row m of x -> xq (int8), dx (scale per group), sx (scale * sum of q per group), xs (the
// sum of q per group).
void quantize_row(const void* x, int bf16, int K, int m, int8_t* xq, float* dx, float* sx,
                  int32_t* xs) {
  const int G = K / GROUP;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int g = 0; g < G; ++g) {
    const size_t off = static_cast<size_t>(m) * K + g * GROUP;
    __m256 v[4];
    __m256 a = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = load8(x, bf16, off + 8 * i);
      a = _mm256_max_ps(a, _mm256_andnot_ps(sign, v[i]));
    }
    const float amax = hmax(a);
    const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
    __m256i q[4];
    __m256i sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; ++i) {
      q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
      sum = _mm256_add_epi32(sum, q[i]);
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + off), _mm256_permutevar8x32_epi32(p, order));
    const float d = amax / 127.0f;
    dx[static_cast<size_t>(m) * G + g] = d;
    xs[static_cast<size_t>(m) * G + g] = hsum(sum);
    sx[static_cast<size_t>(m) * G + g] = d * static_cast<float>(xs[static_cast<size_t>(m) * G + g]);
  }
}

// With VNNI (built for a host that has it: qkernel.py) one vpdpbusd replaces vpmaddubsw +
// vpmaddwd (+ vpaddd): the same exact integer sums (no int16 saturates above), the same bits.
#if defined(__AVXVNNI__)
#define TRD_VNNI 1
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define TRD_VNNI 1
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#else
#define TRD_VNNI 0
#endif

// The weights 2 KB past a group's `bytes` (the next tile's, near a tile's end): the
// hardware's prefetcher stops at page boundaries, and one row's pass is bound by memory
// (measured: a 17920 x 1536 4-bit matrix from DRAM, 1 row 1.11 -> 0.84 ms, 4 rows
// 1.39 -> 0.91).
inline void prefetch_ahead(const uint8_t* group, int bytes) {
  for (int b = 0; b < bytes; b += 64) _mm_prefetch(reinterpret_cast<const char*>(group) + 2048 + b, _MM_HINT_T0);
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// R activation rows (xq, dx, sx, xs point at the first) against one tile: 8 outputs each.
template <int BITS, int R>
void tile(const int8_t* xq, const float* dx, const float* sx, const int32_t* xs, int K,
          const uint8_t* wt, const uint16_t* st, const uint16_t* mt, __m256* acc) {
  const int G = K / GROUP;
  const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int g = 0; g < G; ++g) {
    __m256i dot[R];
    prefetch_ahead(wt + static_cast<size_t>(g) * BITS * 32, BITS * 32);
    if (BITS == 4) {
      const uint8_t* w = wt + static_cast<size_t>(g) * 128;
      __m256i pairs[R];  // int16 sums without VNNI, int32 (the dot itself) with it
      for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
      for (int b = 0; b < 4; ++b) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * 32));
        const __m256i lo = _mm256_and_si256(v, low);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* xb = xq + static_cast<size_t>(r) * K + g * GROUP + b * 8;
#if TRD_VNNI
          pairs[r] = dpbusd(dpbusd(pairs[r], lo, bcast4(xb)), hi, bcast4(xb + 4));
#else
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(lo, bcast4(xb)));
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(hi, bcast4(xb + 4)));
#endif
        }
      }
      for (int r = 0; r < R; ++r) dot[r] = TRD_VNNI ? pairs[r] : _mm256_madd_epi16(pairs[r], ones);
    } else {
      const uint8_t* w = wt + static_cast<size_t>(g) * 256;
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
      for (int b = 0; b < 8; ++b) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + b * 32));
#if TRD_VNNI  // w + 128 as unsigned bytes (flipping the sign bit): no sign tricks per row
        const __m256i u = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
#endif
        for (int r = 0; r < R; ++r) {
          const __m256i xa = bcast4(xq + static_cast<size_t>(r) * K + g * GROUP + b * 4);
#if TRD_VNNI
          dot[r] = dpbusd(dot[r], u, xa);
#else
          const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(xa, xa), _mm256_sign_epi8(v, xa));
          dot[r] = _mm256_add_epi32(dot[r], _mm256_madd_epi16(p, ones));
#endif
        }
      }
#if TRD_VNNI  // sum (w + 128) x - 128 sum x = sum w x: the same integer as without VNNI
      for (int r = 0; r < R; ++r)
        dot[r] = _mm256_sub_epi32(dot[r], _mm256_set1_epi32(128 * xs[static_cast<size_t>(r) * G + g]));
#endif
    }
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(st + g * TILE)));
    for (int r = 0; r < R; ++r) {
      const __m256 scale = _mm256_mul_ps(s, _mm256_set1_ps(dx[static_cast<size_t>(r) * G + g]));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), scale, acc[r]);
    }
    if (BITS == 4) {
      const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mt + g * TILE)));
      for (int r = 0; r < R; ++r)
        acc[r] = _mm256_fnmadd_ps(m, _mm256_set1_ps(sx[static_cast<size_t>(r) * G + g]), acc[r]);
    }
  }
}

#if TRD_VNNI && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define TRD_ZMM 1
// Two tiles at once where AVX-512 VNNI is built in: tile t's 8 outputs in lanes 0-7 of a
// 512-bit register, tile t + 1's (its weights tile_bytes on, its scales and minimums
// `next` on) in lanes 8-15. Lane for lane the very operations of tile<>, so the same bits.
inline __m512i pair(const uint8_t* a, size_t next) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + next));
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

inline __m512 pair_ph(const uint16_t* a, size_t next) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + next));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

template <int BITS, int R>
void tile2(const int8_t* xq, const float* dx, const float* sx, const int32_t* xs, int K,
           const uint8_t* wt, size_t tile_bytes, const uint16_t* st, const uint16_t* mt,
           size_t next, __m512* acc) {
  const int G = K / GROUP;
  const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int g = 0; g < G; ++g) {
    const size_t at = static_cast<size_t>(g) * BITS * 32;
    prefetch_ahead(wt + at, BITS * 32);  // in both tiles
    prefetch_ahead(wt + tile_bytes + at, BITS * 32);
    __m512i dot[R];
    for (int r = 0; r < R; ++r) dot[r] = _mm512_setzero_si512();
    for (int b = 0; b < BITS; ++b) {  // 32-byte steps: 4 (8 columns each) or 8 (4 each)
      const __m512i v = pair(wt + at + b * 32, tile_bytes);
      if (BITS == 4) {
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* xb = xq + static_cast<size_t>(r) * K + g * GROUP + b * 8;
          int32_t x0, x1;
          memcpy(&x0, xb, 4);
          memcpy(&x1, xb + 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(x0));
          dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(x1));
        }
      } else {
        const __m512i u = _mm512_xor_si512(v, flip);
        for (int r = 0; r < R; ++r) {
          int32_t x0;
          memcpy(&x0, xq + static_cast<size_t>(r) * K + g * GROUP + b * 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], u, _mm512_set1_epi32(x0));
        }
      }
    }
    if (BITS == 8)
      for (int r = 0; r < R; ++r)
        dot[r] = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(128 * xs[static_cast<size_t>(r) * G + g]));
    const __m512 s = pair_ph(st + g * TILE, next);
    for (int r = 0; r < R; ++r) {
      const __m512 scale = _mm512_mul_ps(s, _mm512_set1_ps(dx[static_cast<size_t>(r) * G + g]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[r]), scale, acc[r]);
    }
    if (BITS == 4) {
      const __m512 m = pair_ph(mt + g * TILE, next);
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fnmadd_ps(m, _mm512_set1_ps(sx[static_cast<size_t>(r) * G + g]), acc[r]);
    }
  }
}
#else
#define TRD_ZMM 0
#endif

template <int BITS>
void run(const int8_t* xq, const float* dx, const float* sx, const int32_t* xs, int M, int K, int N,
         const uint8_t* qw, const uint16_t* sc, const uint16_t* mn, const float* bias,
         void* out, int ldc, int out_bf16, int add, int threads) {
  const int G = K / GROUP, tiles = N / TILE;
  const size_t tile_bytes = static_cast<size_t>(K) * BITS;  // 8 rows * K * BITS / 8
  for (int mb = 0; mb < M; mb += M_BLOCK) {
    const int m_end = M < mb + M_BLOCK ? M : mb + M_BLOCK;
    const int step = TRD_ZMM ? 2 : 1;  // tiles a pass computes
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int u = 0; u < (tiles + step - 1) / step; ++u) {
      const int t = u * step;
      const uint8_t* wt = qw + t * tile_bytes;
      const uint16_t* st = sc + static_cast<size_t>(t) * G * TILE;
      const uint16_t* mt = BITS == 4 ? mn + static_cast<size_t>(t) * G * TILE : nullptr;
      const __m256 b = bias ? _mm256_loadu_ps(bias + t * TILE) : _mm256_setzero_ps();
      for (int m0 = mb; m0 < m_end; m0 += ROWS) {
        const int r = m_end - m0 < ROWS ? m_end - m0 : ROWS;
        const int8_t* x0 = xq + static_cast<size_t>(m0) * K;
        const float* d0 = dx + static_cast<size_t>(m0) * G;
        const float* s0 = sx + static_cast<size_t>(m0) * G;
        const int32_t* i0 = xs + static_cast<size_t>(m0) * G;
#if TRD_ZMM
        if (t + 1 < tiles) {
          const size_t next = static_cast<size_t>(G) * TILE;
          __m512 acc[ROWS];
          switch (r) {
            case 1: tile2<BITS, 1>(x0, d0, s0, i0, K, wt, tile_bytes, st, mt, next, acc); break;
            case 2: tile2<BITS, 2>(x0, d0, s0, i0, K, wt, tile_bytes, st, mt, next, acc); break;
            case 3: tile2<BITS, 3>(x0, d0, s0, i0, K, wt, tile_bytes, st, mt, next, acc); break;
            default: tile2<BITS, 4>(x0, d0, s0, i0, K, wt, tile_bytes, st, mt, next, acc); break;
          }
          const __m256 b1 = bias ? _mm256_loadu_ps(bias + t * TILE + TILE) : _mm256_setzero_ps();
          for (int i = 0; i < r; ++i) {
            const size_t off = static_cast<size_t>(m0 + i) * ldc + t * TILE;
            const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1));
            store8(out, out_bf16, add, off, _mm256_add_ps(_mm512_castps512_ps256(acc[i]), b));
            store8(out, out_bf16, add, off + TILE, _mm256_add_ps(hi, b1));
          }
          continue;
        }
#endif
        __m256 acc[ROWS];
        switch (r) {
          case 1: tile<BITS, 1>(x0, d0, s0, i0, K, wt, st, mt, acc); break;
          case 2: tile<BITS, 2>(x0, d0, s0, i0, K, wt, st, mt, acc); break;
          case 3: tile<BITS, 3>(x0, d0, s0, i0, K, wt, st, mt, acc); break;
          default: tile<BITS, 4>(x0, d0, s0, i0, K, wt, st, mt, acc); break;
        }
        for (int i = 0; i < r; ++i)
          store8(out, out_bf16, add, static_cast<size_t>(m0 + i) * ldc + t * TILE,
                 _mm256_add_ps(acc[i], b));
      }
    }
  }
}

}  // namespace

extern "C" {

// x (M, K) float32 or bfloat16 (x_bf16); out (M, N) likewise (out_bf16); bias (N) float32 or
// NULL. K % 32 == 0, N % 8 == 0 (the caller checks). Returns 0, or -1 if memory ran out.
int trd_qlinear(const void* x, int x_bf16, int M, int K, int N, int bits, const uint8_t* qw,
                const uint16_t* scales, const uint16_t* mins, const float* bias, void* out,
                int out_bf16, int threads) {
  return trd_qlinear_into(x, x_bf16, M, K, N, bits, qw, scales, mins, bias, out, N, out_bf16,
                          0, threads);
}

int trd_qlinear_into(const void* x, int x_bf16, int M, int K, int N, int bits,
                     const uint8_t* qw, const uint16_t* scales, const uint16_t* mins,
                     const float* bias, void* out, int ldc, int out_bf16, int add, int threads) {
  const int G = K / GROUP;
  int8_t* xq = static_cast<int8_t*>(malloc(static_cast<size_t>(M) * K));
  float* dx = static_cast<float*>(malloc(sizeof(float) * static_cast<size_t>(M) * G * 3));
  if (!xq || !dx) {
    free(xq);
    free(dx);
    return -1;
  }
  float* sx = dx + static_cast<size_t>(M) * G;
  int32_t* xs = reinterpret_cast<int32_t*>(sx + static_cast<size_t>(M) * G);
#pragma omp parallel for num_threads(threads) schedule(static) if (M > 1)
  for (int m = 0; m < M; ++m) quantize_row(x, x_bf16, K, m, xq, dx, sx, xs);
  if (bits == 4)
    run<4>(xq, dx, sx, xs, M, K, N, qw, scales, mins, bias, out, ldc, out_bf16, add, threads);
  else
    run<8>(xq, dx, sx, xs, M, K, N, qw, scales, mins, bias, out, ldc, out_bf16, add, threads);
  free(xq);
  free(dx);
  return 0;
}

}  // extern "C"
