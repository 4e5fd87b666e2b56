// Attention of a prefill chunk over a paged bf16 KV cache, reading the cache's blocks in place.
//
// A chunk of n tokens at position `start` is n * heads query rows over up to start + n keys; at long context
// its attention costs more than its matmuls. The work is bf16 products with float32 sums (VDPBF16PS), the
// fast path's precision: queries (scaled) and the softmax weights are rounded to bf16, keys and values are
// the cache's bf16 values, scores, softmax and sums are float32.
//
// One task per (kv head, tile of the chunk's tokens); the tile's rows (token, query head of the group) are
// the 16-wide vector lanes, so scores are [keys][rows] and the softmax runs down the keys, lanes in
// parallel, with no transposes of K. Per task: scores of every key the tile can see (masked lanes -inf),
// exp and the bf16 weights in key pairs, then the weighted sum of value pairs, normalized at the end.
//
// Cache layout per layer: [kv_heads, num_blocks, block_size, head_dim]; the block table lists the blocks
// holding keys from `first_key` (a block boundary) on.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#include "vec_math.h"
#pragma GCC pop_options

namespace sarathi_kernels {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace {

constexpr int64_t kLanes = 16;
constexpr int kMaxRowVecs = 4;  // at most 64 query rows per task

struct Geometry {
  const uint16_t* k_head;  // this kv head's [num_blocks, block_size, d] as raw bf16
  const uint16_t* v_head;
  const int64_t* table;
  int64_t first_key, block_size, d;
};

inline const uint16_t* row_of(const uint16_t* head, const Geometry& g, int64_t key) {
  const int64_t rel = key - g.first_key;
  return head + (g.table[rel / g.block_size] * g.block_size + rel % g.block_size) * g.d;
}

inline __m512 dot(__m512 acc, __m512i a, __m512i b) {
  return _mm512_dpbf16_ps(acc, (__m512bh)a, (__m512bh)b);
}

// Scores of KG keys for RV vectors of rows: acc[k][r] = sum over d of q(rows) * key k, in float32.
template <int RV, int KG>
inline void score_keys(const uint32_t* qp, const uint16_t* const* keys, int64_t pairs, __m512* acc) {
  for (int i = 0; i < KG * RV; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512i q[RV];
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) q[r] = _mm512_loadu_si512(qp + (p * RV + r) * kLanes);
#pragma GCC unroll 8
    for (int k = 0; k < KG; ++k) {
      int32_t pair;
      std::memcpy(&pair, keys[k] + 2 * p, sizeof(pair));
      const __m512i b = _mm512_set1_epi32(pair);
#pragma GCC unroll 4
      for (int r = 0; r < RV; ++r) acc[k * RV + r] = dot(acc[k * RV + r], q[r], b);
    }
  }
}

template <int RV>
struct Task {
  // Lanes: row = token * rep + head of the group. lo/hi: the keys each row sees (absolute positions).
  __m512i lo[RV], hi[RV];
  int64_t kmin, kmax;  // keys any row of the tile sees, inclusive

  // Pass 1: masked scores into s [kmax - kmin + 1][RV * 16]; returns each lane's max in mx.
  void scores(const uint32_t* qp, const Geometry& g, float* s, __m512* mx) const {
    constexpr int KG = RV <= 3 ? 8 : 4;
    for (int r = 0; r < RV; ++r) mx[r] = _mm512_set1_ps(-INFINITY);
    const int64_t pairs = g.d / 2;
    auto store = [&](int64_t key, const __m512* acc) {
      const __m512i kv = _mm512_set1_epi32(static_cast<int32_t>(key));
      float* row = s + (key - kmin) * RV * kLanes;
      for (int r = 0; r < RV; ++r) {
        const __mmask16 seen = _mm512_cmple_epi32_mask(lo[r], kv) & _mm512_cmple_epi32_mask(kv, hi[r]);
        const __m512 v = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), acc[r]);
        mx[r] = _mm512_max_ps(mx[r], v);
        _mm512_storeu_ps(row + r * kLanes, v);
      }
    };
    int64_t key = kmin;
    __m512 acc[KG * RV];
    const uint16_t* keys[KG];
    for (; key + KG <= kmax + 1; key += KG) {
      for (int k = 0; k < KG; ++k) keys[k] = row_of(g.k_head, g, key + k);
      score_keys<RV, KG>(qp, keys, pairs, acc);
      for (int k = 0; k < KG; ++k) store(key + k, acc + k * RV);
    }
    for (; key <= kmax; ++key) {
      keys[0] = row_of(g.k_head, g, key);
      score_keys<RV, 1>(qp, keys, pairs, acc);
      store(key, acc);
    }
  }

  // Pass 2: bf16 weights exp(s - max) of key pairs, as lane pairs (key 2i low, 2i + 1 high), into w
  // [ceil(keys / 2)][RV * 16]; returns each lane's sum of the rounded weights.
  void weights(const float* s, const __m512* mx, uint32_t* w, __m512* sum) const {
    const int64_t keys = kmax - kmin + 1;
    for (int r = 0; r < RV; ++r) sum[r] = _mm512_setzero_ps();
    auto weight = [&](int64_t j, int r) -> __m256i {
      if (j >= keys) return _mm256_setzero_si256();
      const __m512 v = _mm512_loadu_ps(s + (j * RV + r) * kLanes);
      const __mmask16 seen = _mm512_cmp_ps_mask(v, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ);
      const __m512 e = _mm512_maskz_mov_ps(seen, vec::exp_ps(_mm512_sub_ps(v, mx[r])));
      const __m256i rounded = (__m256i)_mm512_cvtneps_pbh(e);
      sum[r] = _mm512_add_ps(sum[r], _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16)));
      return rounded;
    };
    for (int64_t j = 0; j < keys; j += 2) {
      for (int r = 0; r < RV; ++r) {
        const __m512i even = _mm512_cvtepu16_epi32(weight(j, r));
        const __m512i odd = _mm512_slli_epi32(_mm512_cvtepu16_epi32(weight(j + 1, r)), 16);
        _mm512_storeu_si512(w + (j / 2 * RV + r) * kLanes, _mm512_or_si512(even, odd));
      }
    }
  }

  // Pass 3: o [d][RV * 16] = sum over keys of weight * value, 16 keys (8 pairs) at a time: each pair's
  // values interleaved into vp [8][d] (key 2i low, 2i + 1 high), then DB columns of o in registers.
  void values(const uint32_t* w, const Geometry& g, uint32_t* vp, float* o) const {
    constexpr int DB = RV <= 3 ? 8 : 4;
    const int64_t d = g.d, keys = kmax - kmin + 1, pairs = (keys + 1) / 2;
    std::fill(o, o + d * RV * kLanes, 0.0f);
    __m512i interleave;
    {
      alignas(64) int16_t idx[32];
      for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<int16_t>(i), idx[2 * i + 1] = static_cast<int16_t>(32 + i);
      interleave = _mm512_load_si512(idx);
    }
    for (int64_t p0 = 0; p0 < pairs; p0 += 8) {
      const int64_t tile = std::min<int64_t>(8, pairs - p0);
      for (int64_t p = 0; p < tile; ++p) {
        const int64_t j = kmin + 2 * (p0 + p);
        const uint16_t* a = row_of(g.v_head, g, j);
        const uint16_t* b = j + 1 <= kmax ? row_of(g.v_head, g, j + 1) : nullptr;
        for (int64_t c = 0; c < d; c += kLanes) {
          const __m512i lo16 = _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c)));
          const __m512i hi16 = b ? _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + c)))
                                 : _mm512_setzero_si512();
          _mm512_storeu_si512(vp + p * d + c, _mm512_permutex2var_epi16(lo16, interleave, hi16));
        }
      }
      for (int64_t c0 = 0; c0 < d; c0 += DB) {
        __m512 acc[DB][RV];
        for (int i = 0; i < DB; ++i)
          for (int r = 0; r < RV; ++r) acc[i][r] = _mm512_loadu_ps(o + ((c0 + i) * RV + r) * kLanes);
        for (int64_t p = 0; p < tile; ++p) {
          __m512i wv[RV];
#pragma GCC unroll 4
          for (int r = 0; r < RV; ++r) wv[r] = _mm512_loadu_si512(w + ((p0 + p) * RV + r) * kLanes);
#pragma GCC unroll 8
          for (int i = 0; i < DB; ++i) {
            const __m512i b = _mm512_set1_epi32(static_cast<int32_t>(vp[p * d + c0 + i]));
#pragma GCC unroll 4
            for (int r = 0; r < RV; ++r) acc[i][r] = dot(acc[i][r], wv[r], b);
          }
        }
        for (int i = 0; i < DB; ++i)
          for (int r = 0; r < RV; ++r) _mm512_storeu_ps(o + ((c0 + i) * RV + r) * kLanes, acc[i][r]);
      }
    }
  }
};

struct Scratch {
  std::vector<uint32_t> qp, w, vp;
  std::vector<float> s, o;
};

template <int RV>
void attend_tile(const float* q, int64_t heads, int64_t rep, int64_t group, int64_t t0, int64_t tokens,
                 int64_t start, int64_t window, float scale, const Geometry& g, Scratch& sc, float* out) {
  const int64_t d = g.d, rows = tokens * rep, width = RV * kLanes;
  Task<RV> task;
  alignas(64) int32_t lo[kMaxRowVecs * kLanes], hi[kMaxRowVecs * kLanes];
  sc.qp.assign(static_cast<size_t>(d / 2 * width), 0u);
  for (int64_t row = 0; row < width; ++row) {
    if (row >= rows) {  // padding lanes: zero queries that see every key (finite, never read back)
      lo[row] = INT32_MIN, hi[row] = INT32_MAX;
      continue;
    }
    const int64_t t = row / rep, pos = start + t0 + t;
    hi[row] = static_cast<int32_t>(pos);
    lo[row] = static_cast<int32_t>(window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0);
    const float* qr = q + ((t0 + t) * heads + group * rep + row % rep) * d;
    for (int64_t p = 0; p < d / 2; ++p) {
      const uint32_t even = c10::BFloat16(qr[2 * p] * scale).x, odd = c10::BFloat16(qr[2 * p + 1] * scale).x;
      sc.qp[p * width + row] = even | (odd << 16);
    }
  }
  for (int r = 0; r < RV; ++r) {
    task.lo[r] = _mm512_loadu_si512(lo + r * kLanes);
    task.hi[r] = _mm512_loadu_si512(hi + r * kLanes);
  }
  const int64_t first_pos = start + t0;
  task.kmin = window > 0 ? std::max<int64_t>(g.first_key, first_pos - window + 1) : 0;
  task.kmax = first_pos + tokens - 1;
  const int64_t keys = task.kmax - task.kmin + 1;
  sc.s.resize(static_cast<size_t>(keys * width));
  sc.w.resize(static_cast<size_t>((keys + 1) / 2 * width));
  sc.vp.resize(static_cast<size_t>(8 * d));
  sc.o.resize(static_cast<size_t>(d * width));
  __m512 mx[RV], sum[RV];
  task.scores(sc.qp.data(), g, sc.s.data(), mx);
  task.weights(sc.s.data(), mx, sc.w.data(), sum);
  task.values(sc.w.data(), g, sc.vp.data(), sc.o.data());
  alignas(64) float inv[kMaxRowVecs * kLanes];
  for (int r = 0; r < RV; ++r) _mm512_storeu_ps(inv + r * kLanes, _mm512_div_ps(_mm512_set1_ps(1.0f), sum[r]));
  for (int64_t row = 0; row < rows; ++row) {
    float* dst = out + ((t0 + row / rep) * heads + group * rep + row % rep) * d;
    for (int64_t c = 0; c < d; ++c) dst[c] = sc.o[c * width + row] * inv[row];
  }
}

}  // namespace

// q [n, heads, d] (float32 or bf16) of a chunk whose first token is at `start`, over the bf16 caches
// [kv_heads, num_blocks, block_size, d]: block_table [blocks] holds keys first_key .. start + n - 1.
// Query i sees keys <= start + i (with window > 0: the `window` latest of them). -> float32 [n, heads * d].
at::Tensor chunk_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& block_table, int64_t first_key, int64_t start, int64_t window,
                           double scale) {
  TORCH_CHECK(q_in.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "chunk_attention: q must be [n, heads, d] and the caches [kv_heads, blocks, block_size, d]");
  TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 && v_cache.scalar_type() == at::kBFloat16,
              "chunk_attention: caches must be bf16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "chunk_attention: caches must be contiguous");
  const at::Tensor q = q_in.to(at::kFloat).contiguous();
  const at::Tensor table = block_table.to(at::kLong).contiguous();
  const int64_t n = q.size(0), heads = q.size(1), d = q.size(2);
  const int64_t kv_heads = k_cache.size(0), num_blocks = k_cache.size(1), block_size = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == d && d % kLanes == 0, "chunk_attention: head_dim must match and be a multiple of 16");
  TORCH_CHECK(heads % kv_heads == 0, "chunk_attention: ", heads, " heads do not group over ", kv_heads, " kv heads");
  const int64_t rep = heads / kv_heads;
  TORCH_CHECK(rep <= kMaxRowVecs * kLanes, "chunk_attention: more than 64 query heads per kv head");
  TORCH_CHECK(first_key >= 0 && first_key % block_size == 0 &&
                  first_key <= (window > 0 ? std::max<int64_t>(0, start - window + 1) : 0),
              "chunk_attention: first_key must be a block boundary at or before the first key seen");
  TORCH_CHECK(table.dim() == 1 && table.size(0) * block_size >= start + n - first_key,
              "chunk_attention: the block table does not cover the chunk's keys");
  if (n > 0) {
    TORCH_CHECK(table.min().item<int64_t>() >= 0 && table.max().item<int64_t>() < num_blocks,
                "chunk_attention: block id outside the cache");
  }
  at::Tensor out = at::empty({n, heads * d}, q.options());
  // Tokens per task: at most 64 rows, and enough tasks for every thread twice where the chunk allows.
  const int64_t most = std::max<int64_t>(1, kMaxRowVecs * kLanes / rep);
  const int64_t want = std::max<int64_t>((n + most - 1) / most, (2 * at::get_num_threads() + kv_heads - 1) / kv_heads);
  const int64_t per_task = std::max<int64_t>(1, (n + want - 1) / want);
  const int64_t tiles = (n + per_task - 1) / per_task;
  const int64_t row_vecs = (per_task * rep + kLanes - 1) / kLanes;
  const float* qp = q.data_ptr<float>();
  const auto* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<at::BFloat16>());
  const auto* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<at::BFloat16>());
  const int64_t head_stride = num_blocks * block_size * d;
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, kv_heads * tiles, 1, [&](int64_t b, int64_t e) {
    Scratch scratch;
    for (int64_t task = b; task < e; ++task) {
      const int64_t group = task / tiles, t0 = task % tiles * per_task, tokens = std::min(per_task, n - t0);
      const Geometry g{kp + group * head_stride, vp + group * head_stride, table.data_ptr<int64_t>(), first_key,
                       block_size, d};
      switch (row_vecs) {
        case 1: attend_tile<1>(qp, heads, rep, group, t0, tokens, start, window, s, g, scratch, op); break;
        case 2: attend_tile<2>(qp, heads, rep, group, t0, tokens, start, window, s, g, scratch, op); break;
        case 3: attend_tile<3>(qp, heads, rep, group, t0, tokens, start, window, s, g, scratch, op); break;
        default: attend_tile<4>(qp, heads, rep, group, t0, tokens, start, window, s, g, scratch, op); break;
      }
    }
  });
  return out;
}

#pragma GCC pop_options

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("chunk_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, int first_key, "
          "int start, int window, float scale) -> Tensor",
          &chunk_attention);
}

}  // namespace sarathi_kernels
