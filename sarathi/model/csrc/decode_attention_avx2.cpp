// Decode attention's AVX2 build (CPUs without AVX512-BF16: AMD Zen 2/3, Intel before Cooper Lake): the same
// tasks as decode_attention.cpp (decode_attention_tasks.h), the same float32 math over keys and values widened
// exactly from the cache, on 8-lane vectors. AVX2 has 16 vector registers, so a task runs its query heads
// one after the other (the span's keys stay in L1 between them) and keeps at most 64 of a head's output
// columns in registers at a time.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernel_ops.h"
#include "parallel_ranges.h"  // before the target pragmas: plain x86-64 code

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "decode_attention_tasks.h"
#include "vec_math_avx2.h"

namespace sarathi_kernels {
namespace {

constexpr int64_t kLanes = 8;

using vec_avx2::exp8;
using vec_avx2::sum8;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const at::BFloat16* p) {
  // bf16 is the top half of a float32: widening is exact.
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// Each of `rows` rows of `n` scores -> its softmax, in place; each row's max and sum of exponentials into
// stats[2 * row], stats[2 * row + 1].
void softmax_rows(float* scores, int64_t rows, int64_t n, float* stats) {
  const int64_t full = n / kLanes * kLanes;
  for (int64_t h = 0; h < rows; ++h) {
    float* s = scores + h * n;
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < full; j += kLanes) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    alignas(32) float lanes[kLanes];
    _mm256_store_ps(lanes, mx);
    float top = -INFINITY;
    for (float v : lanes) top = std::max(top, v);
    for (int64_t j = full; j < n; ++j) top = std::max(top, s[j]);
    const __m256 m = _mm256_set1_ps(top);
    __m256 sum = _mm256_setzero_ps();
    for (int64_t j = 0; j < full; j += kLanes) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
      _mm256_storeu_ps(s + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    float total = sum8(sum);
    if (full < n) {  // the last n % 8 scores through a padded buffer (the padding is not read back)
      alignas(32) float tail[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) tail[j] = full + j < n ? s[full + j] : top;
      _mm256_store_ps(tail, exp8(_mm256_sub_ps(_mm256_load_ps(tail), m)));
      for (int64_t j = full; j < n; ++j) s[j] = tail[j - full], total += tail[j - full];
    }
    stats[2 * h] = top, stats[2 * h + 1] = total;
    const float inv = 1.0f / total;
    const __m256 iv = _mm256_set1_ps(inv);
    for (int64_t j = 0; j < full; j += kLanes) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), iv));
    for (int64_t j = full; j < n; ++j) s[j] *= inv;
  }
}

// One task: `rep` query heads [rep, d] over keys [first, context) of one kv head; D = head_dim when it is a
// compile-time constant (64, 128, 256), else 0 and d at run time (any multiple of 16 up to 256).
template <typename T, int D>
void attend(const float* q, const T* k_head, const T* v_head, const int64_t* table, int64_t first, int64_t context,
            int64_t block_size, int64_t d_rt, int64_t rep, float scale, float* scores, float* out, float* stats,
            Ahead& ahead) {
  const int64_t d = D ? D : d_rt, n = context - first;
  for (int64_t h = 0; h < rep; ++h) {
    const float* qh = q + h * d;
    float* s = scores + h * n;
    for_each_key(k_head, h + 1 == rep ? v_head : nullptr, table, first, context, block_size, d, ahead,
                 [&](int64_t j, const T* key) {
                   __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
#pragma GCC unroll 16
                   for (int64_t i = 0; i < d; i += 2 * kLanes) {
                     a0 = _mm256_fmadd_ps(load8(qh + i), load8(key + i), a0);
                     a1 = _mm256_fmadd_ps(load8(qh + i + kLanes), load8(key + i + kLanes), a1);
                   }
                   s[j] = sum8(_mm256_add_ps(a0, a1)) * scale;
                 });
  }
  softmax_rows(scores, rep, n, stats);
  constexpr int64_t kCols = 8 * kLanes;  // output columns per pass: 8 accumulators
  for (int64_t h = 0; h < rep; ++h) {
    const float* s = scores + h * n;
    for (int64_t c0 = 0; c0 < d; c0 += kCols) {
      const int64_t vecs = std::min(kCols, d - c0) / kLanes;
      __m256 acc[8];
#pragma GCC unroll 8
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for_each_key(v_head, static_cast<const T*>(nullptr), table, first, context, block_size, d, ahead,
                   [&](int64_t j, const T* value) {
                     const __m256 p = _mm256_set1_ps(s[j]);
                     const T* v = value + c0;
                     if (vecs == 8) {
#pragma GCC unroll 8
                       for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(p, load8(v + i * kLanes), acc[i]);
                     } else {
                       for (int64_t i = 0; i < vecs; ++i) acc[i] = _mm256_fmadd_ps(p, load8(v + i * kLanes), acc[i]);
                     }
                   });
      for (int64_t i = 0; i < vecs; ++i) _mm256_storeu_ps(out + h * d + c0 + i * kLanes, acc[i]);
    }
  }
}

// out[d] = the softmax-weighted mean of `n` spans' normalized outputs (span c's at partial + c * stride, its
// softmax max and sum at stats + c * stat_stride).
void merge_spans(const float* partial, int64_t stride, const float* stats, int64_t stat_stride, int64_t n,
                 int64_t d, float* out) {
  float top = -INFINITY, total = 0.0f;
  for (int64_t c = 0; c < n; ++c) top = std::max(top, stats[c * stat_stride]);
  for (int64_t i = 0; i < d; i += kLanes) _mm256_storeu_ps(out + i, _mm256_setzero_ps());
  for (int64_t c = 0; c < n; ++c) {
    const float w = stats[c * stat_stride + 1] * std::exp(stats[c * stat_stride] - top);
    total += w;
    for (int64_t i = 0; i < d; i += kLanes)
      _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(partial + c * stride + i),
                                                _mm256_loadu_ps(out + i)));
  }
  const __m256 inv = _mm256_set1_ps(1.0f / total);
  for (int64_t i = 0; i < d; i += kLanes) _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(out + i), inv));
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
         const at::Tensor& lens, double scale, int64_t window, at::Tensor& out) {
  const int64_t heads = q.size(1), d = q.size(2), kv_heads = k_cache.size(0), rep = heads / kv_heads;
  const int64_t block_size = k_cache.size(2);
  const float s = static_cast<float>(scale);
  using Fn = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, int64_t,
                      int64_t, float, float*, float*, float*, Ahead&);
  const Fn fn = d == 64 ? &attend<T, 64> : d == 128 ? &attend<T, 128> : d == 256 ? &attend<T, 256> : &attend<T, 0>;
  run_tasks<T>(
      q, k_cache, v_cache, tables, lens, window, kv_heads, out,
      [&](const float* qu, const T* k_head, const T* v_head, const int64_t* table, int64_t first, int64_t context,
          float* scores, float* o, float* st, Ahead& ahead) {
        fn(qu, k_head, v_head, table, first, context, block_size, d, rep, s, scores, o, st, ahead);
      },
      merge_spans);
}

}  // namespace

void decode_attention_avx2(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& tables, const at::Tensor& lens, double scale, int64_t window,
                           at::Tensor& out) {
  if (k_cache.scalar_type() == at::kBFloat16) {
    run<at::BFloat16>(q, k_cache, v_cache, tables, lens, scale, window, out);
  } else {
    run<float>(q, k_cache, v_cache, tables, lens, scale, window, out);
  }
}

}  // namespace sarathi_kernels

#pragma GCC pop_options
