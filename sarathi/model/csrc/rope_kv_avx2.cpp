// rope_write_kv's AVX2 build (CPUs without AVX512-BF16): rope_kv_run.h's pass on 8-lane vectors, the same
// arithmetic in the same order as the AVX-512 build (rope_kv.cpp), bf16 rounded to nearest even in integer
// code (AVX2 has no conversion instruction for it).

#include <ATen/core/Tensor.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernel_ops.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
// Bit for bit PyTorch's mul + addcmul, as in rope_kv.cpp: the compiler may contract nothing.
#pragma GCC optimize("fp-contract=off")
#include "rope_kv_run.h"

namespace sarathi_kernels {
namespace {

// rope_kv_run.h's lanes: 8 floats in a ymm register.
struct Avx2 {
  using V = __m256;
  static constexpr int64_t kWidth = 8;

  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }

  // x * cos + swap(x) * sin for 8 lanes at offset i of a head (half = d / 2, a multiple of 16).
  static V rotate(const float* x, const float* cos, const float* sin, int64_t i, int64_t half) {
    const int64_t partner = i < half ? i + half : i - half;
    const __m256 a = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(cos + i));
    return _mm256_fmadd_ps(_mm256_loadu_ps(x + partner), _mm256_loadu_ps(sin + i), a);
  }

  // dst = src / rms(src) * w over one head of d floats (d a multiple of 16).
  static void rms_norm_head(const float* src, const float* w, float eps, int64_t d, float* dst) {
    __m256 sq = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += kWidth) {
      const __m256 x = _mm256_loadu_ps(src + i);
      sq = _mm256_fmadd_ps(x, x, sq);
    }
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(sq), _mm256_extractf128_ps(sq, 1));
    const __m128 q = _mm_add_ps(h, _mm_movehl_ps(h, h));
    const float total = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
    const __m256 inv = _mm256_set1_ps(1.0f / std::sqrt(total / static_cast<float>(d) + eps));
    for (int64_t i = 0; i < d; i += kWidth)
      _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), inv), _mm256_loadu_ps(w + i)));
  }

  static V store_cache(float* dst, V v) {
    _mm256_storeu_ps(dst, v);
    return v;
  }

  // bf16 nearest even: add 0x7FFF plus the kept part's lowest bit, keep the top 16 bits; NaN -> 0x7FC0, as
  // c10::BFloat16 rounds.
  static V store_cache(at::BFloat16* dst, V v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF)));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC00000), nan);
    const __m256i top = _mm256_srli_epi32(rounded, 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
    return _mm256_castsi256_ps(_mm256_slli_epi32(top, 16));
  }
};

}  // namespace

void rope_write_kv_avx2(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                        at::Tensor& v_cache, const at::Tensor& slots, int64_t heads, at::Tensor& q_out,
                        at::Tensor* k_out, at::Tensor* v_out, const float* q_norm, const float* k_norm, float eps) {
  if (k_cache.scalar_type() == at::kBFloat16) {
    rope_kv_run<Avx2, at::BFloat16>(qkv, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out, v_out, q_norm,
                                    k_norm, eps);
  } else {
    rope_kv_run<Avx2, float>(qkv, cos, sin, k_cache, v_cache, slots, heads, q_out, k_out, v_out, q_norm, k_norm,
                             eps);
  }
}

}  // namespace sarathi_kernels

#pragma GCC pop_options
