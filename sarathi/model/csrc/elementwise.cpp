// Fused elementwise steps of a decoder layer in bf16 math, each one pass over its rows instead of 2-4
// PyTorch ops (at one decode token, dispatch dominates these ops; at prefill, memory traffic):
// - silu_mul_bf16: down_proj's input bf16(silu(gate) * up) from gate_up's float32 output [T, 2I].
// - gelu_mul_bf16: the same with GELU-tanh (Gemma): bf16(gelu_tanh(gate) * up).
// - add_rms_norm_bf16: residual += x (float32, in place; x may be None), then bf16(rms_norm(residual) * w).
// - norm_add_rms_norm_bf16: Gemma's "sandwich" step: residual += rms_norm(x) * w_x (float32, in place), then,
//   with w_next, bf16(rms_norm(residual) * w_next) (else an empty tensor).
// Math in float32; the bf16 results are rounded to nearest even, as Tensor.to(torch.bfloat16) does.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "contiguous_as.h"  // before the target pragmas: plain x86-64 code, shared by every build

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

// bf16(act(gate) * up) per row of gate_up [T, 2I] float32, act one of the two gates below.
template <typename Act>
at::Tensor gated_bf16(const at::Tensor& gate_up, const char* name, Act act) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.scalar_type() == at::kFloat, name,
              ": gate_up must be float32 [T, 2I]");
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
        store_bf16(dst + r * width + j, m, _mm512_mul_ps(act(gv), uv));
      }
    }
  });
  return out;
}

// x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3)): GELU-tanh, since 0.5 * (1 + tanh(z)) = sigmoid(2z).
at::Tensor gelu_mul_bf16(const at::Tensor& gate_up) {
  return gated_bf16(gate_up, "gelu_mul_bf16", [](__m512 x) {
    const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
    const __m512 z = _mm512_mul_ps(_mm512_set1_ps(-1.5957691216057308f),  // -2 * sqrt(2 / pi)
                                   _mm512_fmadd_ps(_mm512_set1_ps(0.044715f), x3, x));
    return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(z)));
  });
}

// 1 / sqrt(mean(v^2) + eps) over one row of `width` floats.
inline float inv_rms(const float* v, int64_t width, float eps) {
  __m512 sq = _mm512_setzero_ps();
  for (int64_t j = 0; j < width; j += kLanes) {
    const __m512 x = _mm512_maskz_loadu_ps(tail_mask(width - j), v + j);
    sq = _mm512_fmadd_ps(x, x, sq);
  }
  return 1.0f / std::sqrt(_mm512_reduce_add_ps(sq) / static_cast<float>(width) + eps);
}

at::Tensor norm_add_rms_norm_bf16(at::Tensor& residual, const at::Tensor& x_in, const at::Tensor& w_x,
                                  const std::optional<at::Tensor>& w_next_opt, double eps) {
  TORCH_CHECK(residual.dim() == 2 && residual.scalar_type() == at::kFloat && residual.is_contiguous(),
              "norm_add_rms_norm_bf16: residual must be contiguous float32 [T, H]");
  const int64_t rows = residual.size(0), width = residual.size(1);
  const at::Tensor x = contiguous_as(x_in, at::kFloat);
  TORCH_CHECK(x.sizes() == residual.sizes(), "norm_add_rms_norm_bf16: x and residual differ in shape");
  TORCH_CHECK(w_x.numel() == width && w_x.scalar_type() == at::kFloat && w_x.is_contiguous(),
              "norm_add_rms_norm_bf16: w_x must be contiguous float32 [H]");
  const bool next = w_next_opt.has_value() && w_next_opt->defined();
  if (next)
    TORCH_CHECK(w_next_opt->numel() == width && w_next_opt->scalar_type() == at::kFloat && w_next_opt->is_contiguous(),
                "norm_add_rms_norm_bf16: w_next must be contiguous float32 [H]");
  at::Tensor out = at::empty({next ? rows : 0, width}, residual.options().dtype(at::kBFloat16));
  float* h = residual.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* wx = w_x.data_ptr<float>();
  const float* wn = next ? w_next_opt->data_ptr<float>() : nullptr;
  at::BFloat16* dst = next ? out.data_ptr<at::BFloat16>() : nullptr;
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* hr = h + r * width;
      const float* xr = xp + r * width;
      const __m512 ix = _mm512_set1_ps(inv_rms(xr, width, e));
      for (int64_t j = 0; j < width; j += kLanes) {
        const __mmask16 m = tail_mask(width - j);
        const __m512 normed = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xr + j), ix),
                                            _mm512_maskz_loadu_ps(m, wx + j));
        _mm512_mask_storeu_ps(hr + j, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, hr + j), normed));
      }
      if (!next) continue;
      const __m512 ih = _mm512_set1_ps(inv_rms(hr, width, e));
      for (int64_t j = 0; j < width; j += kLanes) {
        const __mmask16 m = tail_mask(width - j);
        const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, hr + j), ih), _mm512_maskz_loadu_ps(m, wn + j));
        store_bf16(dst + r * width + j, m, v);
      }
    }
  });
  return out;
}

at::Tensor silu_mul_bf16(const at::Tensor& gate_up) {
  return gated_bf16(gate_up, "silu_mul_bf16", [](__m512 x) {
    const __m512 sig = _mm512_div_ps(_mm512_set1_ps(1.0f),
                                     _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x))));
    return _mm512_mul_ps(x, sig);
  });
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
    x = contiguous_as(*x_opt, at::kFloat);
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
  lib.def("gelu_mul_bf16(Tensor gate_up) -> Tensor", &gelu_mul_bf16);
  lib.def("norm_add_rms_norm_bf16(Tensor(a!) residual, Tensor x, Tensor w_x, Tensor? w_next, float eps) -> Tensor",
          &norm_add_rms_norm_bf16);
  lib.def("add_rms_norm_bf16(Tensor(a!) residual, Tensor? x, Tensor weight, float eps) -> Tensor", &add_rms_norm_bf16);
}

}  // namespace sarathi_kernels
