// Fused elementwise steps of a decoder layer in bf16 math, each one pass over its rows instead of 2-4
// PyTorch ops (at one decode token, dispatch dominates these ops; at prefill, memory traffic):
// - silu_mul_bf16: down_proj's input bf16(silu(gate) * up) from gate_up's float32 output [T, 2I].
// - add_rms_norm_bf16: residual += x (float32, in place; x may be None), then bf16(rms_norm(residual) * w).
// Math in float32; the bf16 results are rounded to nearest even, as Tensor.to(torch.bfloat16) does.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <optional>

// vec_math.h is AVX-512 code, compiled for it (callers run only where cpu_supported() says so).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
#include "vec_math.h"
#pragma GCC pop_options

namespace sarathi_kernels {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace {

constexpr int64_t kLanes = 16;

using vec::exp_ps;

inline __mmask16 tail_mask(int64_t left) {
  return left >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

inline void store_bf16(at::BFloat16* dst, __mmask16 mask, __m512 v) {
  _mm256_mask_storeu_epi16(dst, mask, (__m256i)_mm512_cvtneps_pbh(v));
}

}  // namespace

at::Tensor silu_mul_bf16(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.scalar_type() == at::kFloat,
              "silu_mul_bf16: gate_up must be float32 [T, 2I]");
  const at::Tensor gu = gate_up.contiguous();
  const int64_t rows = gu.size(0), width = gu.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, gu.options().dtype(at::kBFloat16));
  const float* src = gu.data_ptr<float>();
  at::BFloat16* dst = out.data_ptr<at::BFloat16>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = src + r * 2 * width;
      const float* u = g + width;
      for (int64_t j = 0; j < width; j += kLanes) {
        const __mmask16 m = tail_mask(width - j);
        const __m512 gv = _mm512_maskz_loadu_ps(m, g + j), uv = _mm512_maskz_loadu_ps(m, u + j);
        const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f),
                                         _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        store_bf16(dst + r * width + j, m, _mm512_mul_ps(_mm512_mul_ps(gv, sig), uv));
      }
    }
  });
  return out;
}

at::Tensor add_rms_norm_bf16(at::Tensor& residual, const std::optional<at::Tensor>& x_opt, const at::Tensor& weight,
                             double eps) {
  TORCH_CHECK(residual.dim() == 2 && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
              "add_rms_norm_bf16: residual must be contiguous float32 [T, H]");
  const int64_t rows = residual.size(0), width = residual.size(1);
  TORCH_CHECK(weight.numel() == width && weight.scalar_type() == at::kFloat && weight.is_contiguous(),
              "add_rms_norm_bf16: weight must be contiguous float32 [H]");
  at::Tensor x;
  if (x_opt.has_value() && x_opt->defined()) {
    x = x_opt->to(at::kFloat).contiguous();
    TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm_bf16: x and residual differ in shape");
  }
  at::Tensor out = at::empty({rows, width}, residual.options().dtype(at::kBFloat16));
  float* h = residual.data_ptr<float>();
  const float* xp = x.defined() ? x.data_ptr<float>() : nullptr;
  const float* w = weight.data_ptr<float>();
  at::BFloat16* dst = out.data_ptr<at::BFloat16>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* hr = h + r * width;
      __m512 sq = _mm512_setzero_ps();
      for (int64_t j = 0; j < width; j += kLanes) {
        const __mmask16 m = tail_mask(width - j);
        __m512 v = _mm512_maskz_loadu_ps(m, hr + j);
        if (xp) {
          v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, xp + r * width + j));
          _mm512_mask_storeu_ps(hr + j, m, v);
        }
        sq = _mm512_fmadd_ps(v, v, sq);
      }
      const float inv = 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(width) + e);
      const __m512 iv = _mm512_set1_ps(inv);
      for (int64_t j = 0; j < width; j += kLanes) {
        const __mmask16 m = tail_mask(width - j);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, hr + j), iv), _mm512_maskz_loadu_ps(m, w + j));
        store_bf16(dst + r * width + j, m, v);
      }
    }
  });
  return out;
}

#pragma GCC pop_options

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("silu_mul_bf16(Tensor gate_up) -> Tensor", &silu_mul_bf16);
  lib.def("add_rms_norm_bf16(Tensor(a!) residual, Tensor? x, Tensor weight, float eps) -> Tensor", &add_rms_norm_bf16);
}

}  // namespace sarathi_kernels
