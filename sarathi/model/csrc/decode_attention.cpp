// Decode attention over a paged KV cache, reading the cache's blocks in place (no gather into a buffer).
//
// One task per (sequence, kv head, span of keys; decode_attention_tasks.h): its `rep` query heads (grouped-query
// attention) score the span's keys, a float32 softmax over them, then the weighted sum of values. Queries,
// scores, softmax and accumulation are float32; keys and values are read as stored (bf16 or float32) and
// widened exactly. This file is the AVX-512 build; CPUs without AVX512-BF16 run decode_attention_avx2.cpp's.
//
// Cache layout per layer: [kv_heads, num_blocks, block_size, head_dim]; block_tables [B, max_blocks].

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "contiguous_as.h"
#include "kernel_ops.h"
#include "parallel_ranges.h"  // before the target pragmas: plain x86-64 code

// The task split and vec_math.h, compiled for AVX-512 here (run only where cpu_supported() says so).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "decode_attention_tasks.h"
#include "vec_math.h"
#pragma GCC pop_options

namespace sarathi_kernels {

// Everything from here is compiled for AVX-512; the Python side runs it only where cpu_supported() says so.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

namespace {

constexpr int64_t kLanes = 16;

template <typename T>
inline __m512 load16(const T* p);

template <>
inline __m512 load16<float>(const float* p) {
  return _mm512_loadu_ps(p);
}

template <>
inline __m512 load16<at::BFloat16>(const at::BFloat16* p) {
  // bf16 is the top half of a float32: widening is exact.
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// The lane sums of 16 vectors a[0..15] (lane r of the result: a[r]'s sum), each added in the order of
// _mm512_reduce_add_ps (halves, then quarters, then lanes 0 + 2 and 1 + 3, then those two), so bit for bit its
// result: 47 instructions for 16 sums instead of ~9 each.
inline __m512 sum_lanes16(const float (*a)[kLanes]) {
  __m512 s[8], t[4], u[2];
#pragma GCC unroll 8
  for (int p = 0; p < 8; ++p) {  // lane halves: [a: 4 + 4 | b: 4 + 4] of x_i + x_(i+8)
    const __m512 x = _mm512_load_ps(a[2 * p]), y = _mm512_load_ps(a[2 * p + 1]);
    s[p] = _mm512_add_ps(_mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
  }
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p)  // quarters: one vector's 4 sums per 128-bit chunk
    t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
  for (int p = 0; p < 2; ++p)  // lanes 0 + 2 and 1 + 3 of each chunk
    u[p] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * p], t[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * p], t[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  // lane 4c + r of v holds vector 4r + c's sum
  const __m512i order = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  return _mm512_permutexvar_ps(order, v);
}

// Each of `rows` rows of `context` scores -> its softmax, in place; each row's max and sum of exponentials
// into stats[2 * row], stats[2 * row + 1].
void softmax_rows(float* scores, int64_t rows, int64_t context, float* stats) {
  const int64_t full = context / kLanes * kLanes;
  const __mmask16 tail = static_cast<__mmask16>((1u << (context - full)) - 1u);
  for (int64_t h = 0; h < rows; ++h) {
    float* s = scores + h * context;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < full; j += kLanes) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
    if (tail) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, s + full));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < full; j += kLanes) {
      const __m512 e = vec::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
      _mm512_storeu_ps(s + j, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
      const __m512 e = vec::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + full), m));
      _mm512_mask_storeu_ps(s + full, tail, e);
      sum = _mm512_mask_add_ps(sum, tail, sum, e);
    }
    const float total = _mm512_reduce_add_ps(sum);
    stats[2 * h] = _mm512_reduce_max_ps(mx), stats[2 * h + 1] = total;
    const __m512 inv = _mm512_set1_ps(1.0f / total);
    for (int64_t j = 0; j < full; j += kLanes) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
    if (tail) _mm512_mask_storeu_ps(s + full, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + full), inv));
  }
}

// One (sequence, kv head): VECS = head_dim / 16 and REP query heads as compile-time constants, so the
// queries and accumulators live in registers.
template <typename T, int VECS, int REP>
void attend_group(
    const float* q,  // [REP, d]
    const T* k_head, const T* v_head,  // this kv head's [num_blocks, block_size, d]
    const int64_t* table, int64_t first, int64_t context, int64_t block_size, float scale,
    float* scores,  // scratch [REP, context - first]
    float* out,  // [REP, d]
    float* stats,  // [REP, 2]: softmax max and sum
    Ahead& ahead) {  // the thread's next task, prefetched meanwhile
  constexpr int64_t d = VECS * kLanes;
  const int64_t n = context - first;
  __m512 qv[REP][VECS];
#pragma GCC unroll 16
  for (int h = 0; h < REP; ++h)
#pragma GCC unroll 16
    for (int i = 0; i < VECS; ++i) qv[h][i] = _mm512_mul_ps(_mm512_loadu_ps(q + h * d + i * kLanes), _mm512_set1_ps(scale));
  // Each key's REP dot products wait here as 16 partial sums until 16 keys are in: then sum_lanes16 reduces
  // them together (a reduction per key took ~9 instructions of its own).
  alignas(64) float pending[REP][kLanes][kLanes];
  int64_t held = 0, j0 = 0;
  for_each_key(k_head, v_head, table, first, context, block_size, d, ahead, [&](int64_t j, const T* key) {
    __m512 kv[VECS];
#pragma GCC unroll 16
    for (int i = 0; i < VECS; ++i) kv[i] = load16(key + i * kLanes);
    if (held == 0) j0 = j;
#pragma GCC unroll 16
    for (int h = 0; h < REP; ++h) {
      __m512 acc = _mm512_mul_ps(qv[h][0], kv[0]);
#pragma GCC unroll 16
      for (int i = 1; i < VECS; ++i) acc = _mm512_fmadd_ps(qv[h][i], kv[i], acc);
      _mm512_store_ps(pending[h][held], acc);
    }
    if (++held == kLanes) {
#pragma GCC unroll 16
      for (int h = 0; h < REP; ++h) _mm512_storeu_ps(scores + h * n + j0, sum_lanes16(pending[h]));
      held = 0;
    }
  });
  for (int h = 0; h < REP; ++h)
    for (int64_t i = 0; i < held; ++i) scores[h * n + j0 + i] = _mm512_reduce_add_ps(_mm512_load_ps(pending[h][i]));
  softmax_rows(scores, REP, n, stats);
  __m512 acc[REP][VECS];
#pragma GCC unroll 16
  for (int h = 0; h < REP; ++h)
#pragma GCC unroll 16
    for (int i = 0; i < VECS; ++i) acc[h][i] = _mm512_setzero_ps();
  // bf16 values: 32 at a time, split into their even and odd positions (two instructions for 32 rather than
  // four); accumulators 2c and 2c + 1 then hold the even and odd positions of values 32c .. 32c + 31, each
  // summed as before, and are interleaved once at the end
  constexpr bool kPairs = std::is_same_v<T, at::BFloat16> && VECS % 2 == 0;
  for_each_key(v_head, static_cast<const T*>(nullptr), table, first, context, block_size, d, ahead, [&](int64_t j, const T* value) {
    __m512 vv[VECS];
    if constexpr (kPairs) {
#pragma GCC unroll 8
      for (int c = 0; c < VECS / 2; ++c) {
        const __m512i raw = _mm512_loadu_si512(value + c * 2 * kLanes);
        vv[2 * c] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
        vv[2 * c + 1] = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
      }
    } else {
#pragma GCC unroll 16
      for (int i = 0; i < VECS; ++i) vv[i] = load16(value + i * kLanes);
    }
#pragma GCC unroll 16
    for (int h = 0; h < REP; ++h) {
      const __m512 p = _mm512_set1_ps(scores[h * n + j]);
#pragma GCC unroll 16
      for (int i = 0; i < VECS; ++i) acc[h][i] = _mm512_fmadd_ps(p, vv[i], acc[h][i]);
    }
  });
  if constexpr (kPairs) {
    const __m512i low = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
#pragma GCC unroll 16
    for (int h = 0; h < REP; ++h)
#pragma GCC unroll 8
      for (int c = 0; c < VECS / 2; ++c) {
        _mm512_storeu_ps(out + h * d + c * 2 * kLanes, _mm512_permutex2var_ps(acc[h][2 * c], low, acc[h][2 * c + 1]));
        _mm512_storeu_ps(out + h * d + c * 2 * kLanes + kLanes,
                         _mm512_permutex2var_ps(acc[h][2 * c], high, acc[h][2 * c + 1]));
      }
  } else {
#pragma GCC unroll 16
    for (int h = 0; h < REP; ++h)
#pragma GCC unroll 16
      for (int i = 0; i < VECS; ++i) _mm512_storeu_ps(out + h * d + i * kLanes, acc[h][i]);
  }
}

// One query head over its kv head, VECS = head_dim / 16 a compile-time constant: the query and the value
// accumulators live in registers. The same math, in the same order, as attend_group's rows; used where
// attend_group has no instance (head_dim 256: Gemma 3).
template <typename T, int VECS>
void attend_head(const float* q, const T* k_head, const T* v_head, const int64_t* table, int64_t first,
                 int64_t context, int64_t block_size, float scale, float* scores, float* out, float* stats,
                 Ahead& ahead) {
  constexpr int64_t d = VECS * kLanes;
  __m512 qv[VECS];
#pragma GCC unroll 16
  for (int i = 0; i < VECS; ++i) qv[i] = _mm512_mul_ps(_mm512_loadu_ps(q + i * kLanes), _mm512_set1_ps(scale));
  for_each_key(k_head, v_head, table, first, context, block_size, d, ahead, [&](int64_t j, const T* key) {
    __m512 acc = _mm512_mul_ps(qv[0], load16(key));
#pragma GCC unroll 16
    for (int i = 1; i < VECS; ++i) acc = _mm512_fmadd_ps(qv[i], load16(key + i * kLanes), acc);
    scores[j] = _mm512_reduce_add_ps(acc);
  });
  softmax_rows(scores, 1, context - first, stats);
  __m512 acc[VECS];
#pragma GCC unroll 16
  for (int i = 0; i < VECS; ++i) acc[i] = _mm512_setzero_ps();
  for_each_key(v_head, static_cast<const T*>(nullptr), table, first, context, block_size, d, ahead, [&](int64_t j, const T* value) {
    const __m512 p = _mm512_set1_ps(scores[j]);
#pragma GCC unroll 16
    for (int i = 0; i < VECS; ++i) acc[i] = _mm512_fmadd_ps(p, load16(value + i * kLanes), acc[i]);
  });
#pragma GCC unroll 16
  for (int i = 0; i < VECS; ++i) _mm512_storeu_ps(out + i * kLanes, acc[i]);
}

// Any head_dim (multiple of 16, <= 256) and grouping: the same math with runtime loop bounds, one query head
// at a time.
template <typename T>
void attend_group_generic(
    const float* q, const T* k_head, const T* v_head, const int64_t* table, int64_t first, int64_t context,
    int64_t block_size, int64_t d, int64_t rep, float scale, float* scores, float* out, float* stats, Ahead& ahead) {
  const int64_t vecs = d / kLanes, n = context - first;
  for (int64_t h = 0; h < rep; ++h) {
    const float* qh = q + h * d;
    float* s = scores + h * n;
    for_each_key(k_head, v_head, table, first, context, block_size, d, ahead, [&](int64_t j, const T* key) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < vecs; ++i) acc = _mm512_fmadd_ps(_mm512_loadu_ps(qh + i * kLanes), load16(key + i * kLanes), acc);
      s[j] = _mm512_reduce_add_ps(acc) * scale;
    });
  }
  softmax_rows(scores, rep, n, stats);
  for (int64_t h = 0; h < rep; ++h) {
    const float* s = scores + h * n;
    for (int64_t i = 0; i < vecs; ++i) {
      __m512 acc = _mm512_setzero_ps();
      for_each_key(v_head, static_cast<const T*>(nullptr), table, first, context, block_size, d, ahead, [&](int64_t j, const T* value) {
        acc = _mm512_fmadd_ps(_mm512_set1_ps(s[j]), load16(value + i * kLanes), acc);
      });
      _mm512_storeu_ps(out + h * d + i * kLanes, acc);
    }
  }
}

template <typename T>
using HeadFn = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, float, float*,
                        float*, float*, Ahead&);

// The compiled head sizes of attend_head: 64, 128 and 256.
template <typename T>
HeadFn<T> head_specialized(int64_t vecs) {
  if (vecs == 4) return &attend_head<T, 4>;
  if (vecs == 8) return &attend_head<T, 8>;
  if (vecs == 16) return &attend_head<T, 16>;
  return nullptr;
}

template <typename T>
using GroupFn = void (*)(const float*, const T*, const T*, const int64_t*, int64_t, int64_t, int64_t, float, float*,
                         float*, float*, Ahead&);

// The compiled (head_dim / 16, group size) pairs: head_dim 64 or 128, 1 to 8 query heads per kv head.
template <typename T>
GroupFn<T> specialized(int64_t vecs, int64_t rep) {
#define SARATHI_GROUP_CASE(V, R) \
  if (vecs == V && rep == R) return &attend_group<T, V, R>;
#define SARATHI_GROUP_CASES(V)                                                                       \
  SARATHI_GROUP_CASE(V, 1) SARATHI_GROUP_CASE(V, 2) SARATHI_GROUP_CASE(V, 3) SARATHI_GROUP_CASE(V, 4) \
  SARATHI_GROUP_CASE(V, 5) SARATHI_GROUP_CASE(V, 6) SARATHI_GROUP_CASE(V, 7) SARATHI_GROUP_CASE(V, 8)
  SARATHI_GROUP_CASES(4)
  SARATHI_GROUP_CASES(8)
#undef SARATHI_GROUP_CASES
#undef SARATHI_GROUP_CASE
  return nullptr;
}

// out[d] = the softmax-weighted mean of `n` spans' normalized outputs (span c's at partial + c * stride, its
// softmax max and sum at stats + c * stat_stride).
void merge_spans(const float* partial, int64_t stride, const float* stats, int64_t stat_stride, int64_t n,
                 int64_t d, float* out) {
  float top = -INFINITY, total = 0.0f;
  for (int64_t c = 0; c < n; ++c) top = std::max(top, stats[c * stat_stride]);
  for (int64_t i = 0; i < d; i += kLanes) _mm512_storeu_ps(out + i, _mm512_setzero_ps());
  for (int64_t c = 0; c < n; ++c) {
    const float w = stats[c * stat_stride + 1] * std::exp(stats[c * stat_stride] - top);
    total += w;
    for (int64_t i = 0; i < d; i += kLanes)
      _mm512_storeu_ps(out + i, _mm512_fmadd_ps(_mm512_set1_ps(w), _mm512_loadu_ps(partial + c * stride + i),
                                                _mm512_loadu_ps(out + i)));
  }
  const __m512 inv = _mm512_set1_ps(1.0f / total);
  for (int64_t i = 0; i < d; i += kLanes) _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_loadu_ps(out + i), inv));
}

template <typename T>
void run(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& tables,
         const at::Tensor& lens, double scale, int64_t window, at::Tensor& out) {
  const int64_t heads = q.size(1), d = q.size(2), kv_heads = k_cache.size(0), rep = heads / kv_heads;
  const int64_t block_size = k_cache.size(2);
  const float s = static_cast<float>(scale);
  const GroupFn<T> group = specialized<T>(d / kLanes, rep);
  // One query head per task where no grouped instance exists (head_dim 256: Gemma 3), else one kv head's group.
  const HeadFn<T> head = group ? nullptr : head_specialized<T>(d / kLanes);
  run_tasks<T>(
      q, k_cache, v_cache, tables, lens, window, head ? heads : kv_heads, out,
      [&](const float* qu, const T* k_head, const T* v_head, const int64_t* table, int64_t first, int64_t context,
          float* scores, float* o, float* st, Ahead& ahead) {
        if (head) {
          head(qu, k_head, v_head, table, first, context, block_size, s, scores, o, st, ahead);
        } else if (group) {
          group(qu, k_head, v_head, table, first, context, block_size, s, scores, o, st, ahead);
        } else {
          attend_group_generic<T>(qu, k_head, v_head, table, first, context, block_size, d, rep, s, scores, o, st,
                                  ahead);
        }
      },
      merge_spans);
}

}  // namespace

#pragma GCC pop_options

// q [B, heads, d] (cast to float32), caches [kv_heads, num_blocks, block_size, d] (bf16 or float32),
// block_tables [B, max_blocks] int64, context_lens [B] int64 (each >= 1), window (> 0: attend to each row's
// `window` latest keys only) -> float32 [B, heads * d].
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                            int64_t window) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "decode_attention: q must be [B, heads, d] and the caches [kv_heads, blocks, block_size, d]");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "decode_attention: caches must be contiguous");
  TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type(), "decode_attention: k and v caches differ in dtype");
  const at::Tensor q = contiguous_as(q_in, at::kFloat);
  const at::Tensor tables = contiguous_as(block_tables, at::kLong);
  const at::Tensor lens = contiguous_as(context_lens, at::kLong);
  const int64_t batch = q.size(0), heads = q.size(1), d = q.size(2), kv_heads = k_cache.size(0);
  TORCH_CHECK(k_cache.size(3) == d, "decode_attention: head_dim of q (", d, ") and cache differ");
  TORCH_CHECK(d % kLanes == 0 && d <= 256, "decode_attention: head_dim must be a multiple of 16 up to 256");
  TORCH_CHECK(heads % kv_heads == 0, "decode_attention: ", heads, " heads do not group over ", kv_heads,
              " kv heads");
  TORCH_CHECK(tables.dim() == 2 && tables.size(0) == batch && lens.numel() == batch,
              "decode_attention: block_tables / context_lens do not match the batch");
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b)  // a loop, not max()/min() ops: this runs once per layer per step
    TORCH_CHECK(lp[b] >= 1 && lp[b] <= tables.size(1) * k_cache.size(2),
                "decode_attention: context length outside the block table");
  TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 || k_cache.scalar_type() == at::kFloat,
              "decode_attention: cache must be bf16 or float32");
  at::Tensor out = at::empty({batch, heads * d}, q.options());
  static const bool avx512 = cpu_supported();
  if (!avx512) {  // the AVX2 build (the Python side runs this only where cpu_portable_supported() says so)
    decode_attention_avx2(q, k_cache, v_cache, tables, lens, scale, window, out);
  } else if (k_cache.scalar_type() == at::kBFloat16) {
    run<at::BFloat16>(q, k_cache, v_cache, tables, lens, scale, window, out);
  } else {
    run<float>(q, k_cache, v_cache, tables, lens, scale, window, out);
  }
  return out;
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
          "float scale, int window=0) -> Tensor",
          &decode_attention);
}

}  // namespace sarathi_kernels
