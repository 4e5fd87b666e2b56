// RoPE on q and k and the KV-cache write in one pass over the fused qkv projection's output, replacing ~12
// PyTorch ops a layer (slice, roll, mul, addcmul, casts, two index_copy_): at one decode token their dispatch
// cost more than their arithmetic.
//
// qkv [T, heads + 2 * kv_heads, d] float32 (rows: q heads, k heads, v heads); cos, sin [T, d] float32 as
// rope_cos_sin builds them ((cos, cos) and (-sin, sin) over the halves), so rotated = x * cos + swap(x) * sin
// with swap exchanging the halves. Returns q rotated, float32 [T, heads, d]; writes the rotated k and v,
// rounded to the cache dtype (nearest even for bf16), at cache[kv_head][slot]. With return_kv also returns
// them as stored, widened to float32 [T, kv_heads, d] (what a prefill chunk starting at 0 attends to);
// without it they come back empty ([0, kv_heads, d]). With q_norm / k_norm weights [d] (QK-norm: Qwen3,
// Gemma 3), each q and k head is first RMS-normalized over d and scaled by them.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>

#include "contiguous_as.h"
#include "kernel_ops.h"

// This file is the AVX-512 build; CPUs without AVX512-BF16 run rope_kv_avx2.cpp's.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
// x * cos is rounded, then swap(x) * sin is added in one fused multiply-add: bit for bit what PyTorch's mul +
// addcmul compute (rope.apply_rope). A last-bit difference in q, amplified by the bf16 roundings downstream,
// moved SmolLM2's logits by 3e-3; so the compiler may not contract anything else here.
#pragma GCC optimize("fp-contract=off")
#include "rope_kv_run.h"

namespace sarathi_kernels {
namespace {

constexpr int64_t kLanes = 16;

// rope_kv_run.h's lanes: 16 floats in a zmm register.
struct Avx512 {
  using V = __m512;
  static constexpr int64_t kWidth = kLanes;

  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }

  // x * cos + swap(x) * sin for 16 lanes at offset i of a head (half = d / 2, a multiple of 16).
  static V rotate(const float* x, const float* cos, const float* sin, int64_t i, int64_t half) {
    const int64_t partner = i < half ? i + half : i - half;
    const __m512 a = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(cos + i));
    return _mm512_fmadd_ps(_mm512_loadu_ps(x + partner), _mm512_loadu_ps(sin + i), a);
  }

  // dst = src / rms(src) * w over one head of d floats (d a multiple of 16).
  static void rms_norm_head(const float* src, const float* w, float eps, int64_t d, float* dst) {
    __m512 sq = _mm512_setzero_ps();
    for (int64_t i = 0; i < d; i += kLanes) {
      const __m512 x = _mm512_loadu_ps(src + i);
      sq = _mm512_fmadd_ps(x, x, sq);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(d) + eps));
    for (int64_t i = 0; i < d; i += kLanes)
      _mm512_storeu_ps(dst + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(src + i), inv), _mm512_loadu_ps(w + i)));
  }

  // Round to the cache dtype and store; returns the stored value widened back to float32.
  static V store_cache(float* dst, V v) {
    _mm512_storeu_ps(dst, v);
    return v;
  }

  static V store_cache(at::BFloat16* dst, V v) {
    const __m256i raw = (__m256i)_mm512_cvtneps_pbh(v);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), raw);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  }
};

}  // namespace
}  // namespace sarathi_kernels

#pragma GCC pop_options

namespace sarathi_kernels {

std::tuple<at::Tensor, at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qkv_in, const at::Tensor& cos_in,
                                                             const at::Tensor& sin_in, at::Tensor& k_cache,
                                                             at::Tensor& v_cache, const at::Tensor& slot_mapping,
                                                             int64_t heads, bool return_kv,
                                                             const std::optional<at::Tensor>& q_norm,
                                                             const std::optional<at::Tensor>& k_norm, double eps) {
  TORCH_CHECK(qkv_in.dim() == 3 && qkv_in.scalar_type() == at::kFloat,
              "rope_write_kv: qkv must be float32 [T, heads + 2 * kv_heads, head_dim]");
  const int64_t tokens = qkv_in.size(0), rows = qkv_in.size(1), d = qkv_in.size(2);
  TORCH_CHECK(heads > 0 && rows > heads && (rows - heads) % 2 == 0, "rope_write_kv: ", rows,
              " qkv rows do not split into ", heads, " q heads and equal k and v heads");
  const int64_t kv_heads = (rows - heads) / 2;
  TORCH_CHECK(d % (2 * kLanes) == 0, "rope_write_kv: head_dim must be a multiple of 32");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == kv_heads && k_cache.size(3) == d &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "rope_write_kv: caches must be contiguous [kv_heads, blocks, block_size, head_dim] of one dtype");
  TORCH_CHECK(cos_in.numel() == tokens * d && sin_in.numel() == tokens * d, "rope_write_kv: cos/sin must be [T, d]");
  TORCH_CHECK(slot_mapping.numel() == tokens, "rope_write_kv: one slot per token");
  const bool normed = q_norm.has_value() && q_norm->defined();
  TORCH_CHECK(normed == (k_norm.has_value() && k_norm->defined()), "rope_write_kv: q_norm and k_norm come together");
  if (normed)
    TORCH_CHECK(d <= kMaxHeadDim && q_norm->numel() == d && k_norm->numel() == d &&
                    q_norm->scalar_type() == at::kFloat && k_norm->scalar_type() == at::kFloat &&
                    q_norm->is_contiguous() && k_norm->is_contiguous(),
                "rope_write_kv: q_norm and k_norm must be contiguous float32 [head_dim <= 512]");
  const float* qn = normed ? q_norm->data_ptr<float>() : nullptr;
  const float* kn = normed ? k_norm->data_ptr<float>() : nullptr;
  const float e = static_cast<float>(eps);
  const at::Tensor qkv = qkv_in.contiguous();
  const at::Tensor cos = contiguous_as(cos_in, at::kFloat), sin = contiguous_as(sin_in, at::kFloat);
  const at::Tensor slots = contiguous_as(slot_mapping, at::kLong);
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)  // a loop, not min()/max() ops: this runs once per layer per step
    TORCH_CHECK(sp[t] >= 0 && sp[t] < k_cache.size(1) * k_cache.size(2), "rope_write_kv: slot outside the cache");
  at::Tensor q = at::empty({tokens, heads, d}, qkv.options());
  const int64_t kept = return_kv ? tokens : 0;  // empty k and v when not asked for
  at::Tensor k = at::empty({kept, kv_heads, d}, qkv.options());
  at::Tensor v = at::empty({kept, kv_heads, d}, qkv.options());
  at::Tensor* ko = return_kv ? &k : nullptr;
  at::Tensor* vo = return_kv ? &v : nullptr;
  TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 || k_cache.scalar_type() == at::kFloat,
              "rope_write_kv: cache must be bf16 or float32");
  static const bool avx512 = cpu_supported();
  if (!avx512) {  // the AVX2 build (the Python side runs this only where cpu_portable_supported() says so)
    rope_write_kv_avx2(qkv, cos, sin, k_cache, v_cache, slots, heads, q, ko, vo, qn, kn, e);
  } else if (k_cache.scalar_type() == at::kBFloat16) {
    rope_kv_run<Avx512, at::BFloat16>(qkv, cos, sin, k_cache, v_cache, slots, heads, q, ko, vo, qn, kn, e);
  } else {
    rope_kv_run<Avx512, float>(qkv, cos, sin, k_cache, v_cache, slots, heads, q, ko, vo, qn, kn, e);
  }
  return {q, k, v};
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("rope_write_kv(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
          "Tensor slot_mapping, int heads, bool return_kv, Tensor? q_norm=None, Tensor? k_norm=None, "
          "float eps=1e-6) -> (Tensor, Tensor, Tensor)",
          &rope_write_kv);
}

}  // namespace sarathi_kernels
