// A float32 layer's elementwise steps on AVX2, each one pass over its rows instead of 2-5 PyTorch ops (~60 us
// a call for one 576-wide decode row on a Zen3, where dispatch dominates): the norm of the float32 layers,
// and the fused steps of a float32 layer on CPUs without AVX512-BF16 (elementwise.cpp's, with float32
// results instead of bf16):
// - rms_norm_f32: y = x / sqrt(mean(x^2) + eps) * w.
// - add_rms_norm_f32: residual += x (in place; x may be None), then rms_norm(residual) * w.
// - norm_add_rms_norm_f32: Gemma's "sandwich" step: residual += rms_norm(x) * w_x (in place), then, with
//   w_next, rms_norm(residual) * w_next (else an empty tensor).
// - silu_mul_f32, gelu_mul_f32: act(gate) * up from gate_up [T, 2I] (GELU-tanh for Gemma).
// The Python side calls these only where kernels.portable_available() (AVX2 or AVX-512) says so.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "contiguous_as.h"
#include "kernel_ops.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include "vec_math_avx2.h"

namespace sarathi_kernels {
namespace {

using vec_avx2::exp8;
using vec_avx2::sum8;

constexpr int64_t kLanes = 8;

// Lanes i < left (all 8 when left >= 8) as a maskload / maskstore mask.
inline __m256i lanes_below(int64_t left) {
  const int32_t n = static_cast<int32_t>(left < kLanes ? left : kLanes);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

inline __m256 load(const float* p, int64_t left) {
  return left >= kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes_below(left));
}

inline void store(float* p, int64_t left, __m256 v) {
  if (left >= kLanes) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, lanes_below(left), v);
  }
}

// 1 / sqrt(mean(v^2) + eps) over one row of n floats; with x, first v += x (stored).
inline float add_inv_rms(float* v, const float* x, int64_t n, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = _mm256_loadu_ps(v + i), b = _mm256_loadu_ps(v + i + 8);
    if (x) {
      a = _mm256_add_ps(a, _mm256_loadu_ps(x + i)), b = _mm256_add_ps(b, _mm256_loadu_ps(x + i + 8));
      _mm256_storeu_ps(v + i, a), _mm256_storeu_ps(v + i + 8, b);
    }
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  float sum = sum8(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) {
    if (x) v[i] += x[i];
    sum += v[i] * v[i];
  }
  return 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
}

// y = v * inv * w over one row of n floats.
inline void scale_row(const float* v, float inv, const float* w, float* y, int64_t n) {
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int64_t i = 0; i < n; i += kLanes)
    store(y + i, n - i, _mm256_mul_ps(_mm256_mul_ps(load(v + i, n - i), vinv), load(w + i, n - i)));
}

void check_row_weight(const at::Tensor& w, int64_t n, const char* what) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.numel() == n, what,
              " must be contiguous float32 [", n, "]");
}

void check_residual(const at::Tensor& residual, const char* name) {
  TORCH_CHECK(residual.dim() == 2 && residual.scalar_type() == at::kFloat && residual.is_contiguous(), name,
              ": residual must be contiguous float32 [T, H]");
}

// act(gate) * up per row of gate_up [T, 2I] float32.
template <typename Act>
at::Tensor gated_f32(const at::Tensor& gate_up, const char* name, Act act) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.scalar_type() == at::kFloat, name,
              ": gate_up must be float32 [T, 2I]");
  const at::Tensor gu = gate_up.contiguous();
  const int64_t rows = gu.size(0), width = gu.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, gu.options());
  const float* src = gu.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* g = src + r * 2 * width;
      const float* u = g + width;
      for (int64_t j = 0; j < width; j += kLanes)
        store(dst + r * width + j, width - j, _mm256_mul_ps(act(load(g + j, width - j)), load(u + j, width - j)));
    }
  });
  return out;
}

}  // namespace

// x float32 [..., n] (contiguous), w float32 [n]: a new tensor of x's shape, float32 or (bf16) rounded to
// bf16 to nearest even as PyTorch's .to(torch.bfloat16) rounds. With rows (int64 [K], x [T, n]): only those
// rows of x, in that order, [K, n] (the final norm of the rows whose logits are wanted, in one call).
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& w, double eps, const std::optional<at::Tensor>& rows,
                        bool bf16) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1, "rms_norm_f32: x must be contiguous float32");
  const int64_t n = x.size(-1);
  check_row_weight(w, n, "rms_norm_f32: w");
  const bool picked = rows.has_value() && rows->defined();
  at::Tensor index;
  int64_t out_rows = n == 0 ? 0 : x.numel() / n;
  if (picked) {
    TORCH_CHECK(x.dim() == 2 && rows->dim() == 1 && rows->scalar_type() == at::kLong,
                "rms_norm_f32: rows must be int64 [K] over x [T, n]");
    index = rows->contiguous();
    out_rows = index.size(0);
    const int64_t* ip = index.data_ptr<int64_t>();
    for (int64_t i = 0; i < out_rows; ++i)
      TORCH_CHECK(ip[i] >= 0 && ip[i] < x.size(0), "rms_norm_f32: row ", ip[i], " outside x's ", x.size(0), " rows");
  }
  std::vector<int64_t> shape = x.sizes().vec();
  if (picked) shape = {out_rows, n};
  at::Tensor y = at::empty(shape, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  float* xp = const_cast<float*>(x.data_ptr<float>());  // read only: no x to add
  const int64_t* ip = picked ? index.data_ptr<int64_t>() : nullptr;
  const float* wp = w.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, out_rows, 64, [&](int64_t r0, int64_t r1) {
    std::vector<float> row(bf16 ? n : 0);
    for (int64_t r = r0; r < r1; ++r) {
      float* src = xp + (ip ? ip[r] : r) * n;
      if (!bf16) {
        scale_row(src, add_inv_rms(src, nullptr, n, e), wp, y.data_ptr<float>() + r * n, n);
        continue;
      }
      scale_row(src, add_inv_rms(src, nullptr, n, e), wp, row.data(), n);
      at::BFloat16* dst = y.data_ptr<at::BFloat16>() + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = at::BFloat16(row[i]);  // c10's round to nearest even
    }
  });
  return y;
}

at::Tensor add_rms_norm_f32(at::Tensor& residual, const std::optional<at::Tensor>& x_opt, const at::Tensor& weight,
                            double eps) {
  check_residual(residual, "add_rms_norm_f32");
  const int64_t rows = residual.size(0), width = residual.size(1);
  check_row_weight(weight, width, "add_rms_norm_f32: weight");
  at::Tensor x;
  if (x_opt.has_value() && x_opt->defined()) {
    x = contiguous_as(*x_opt, at::kFloat);
    TORCH_CHECK(x.sizes() == residual.sizes(), "add_rms_norm_f32: x and residual differ in shape");
  }
  at::Tensor out = at::empty({rows, width}, residual.options());
  float* h = residual.data_ptr<float>();
  const float* xp = x.defined() ? x.data_ptr<float>() : nullptr;
  const float* w = weight.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* hr = h + r * width;
      scale_row(hr, add_inv_rms(hr, xp ? xp + r * width : nullptr, width, e), w, dst + r * width, width);
    }
  });
  return out;
}

at::Tensor norm_add_rms_norm_f32(at::Tensor& residual, const at::Tensor& x_in, const at::Tensor& w_x,
                                 const std::optional<at::Tensor>& w_next_opt, double eps) {
  check_residual(residual, "norm_add_rms_norm_f32");
  const int64_t rows = residual.size(0), width = residual.size(1);
  const at::Tensor x = contiguous_as(x_in, at::kFloat);
  TORCH_CHECK(x.sizes() == residual.sizes(), "norm_add_rms_norm_f32: x and residual differ in shape");
  check_row_weight(w_x, width, "norm_add_rms_norm_f32: w_x");
  const bool next = w_next_opt.has_value() && w_next_opt->defined();
  if (next) check_row_weight(*w_next_opt, width, "norm_add_rms_norm_f32: w_next");
  at::Tensor out = at::empty({next ? rows : 0, width}, residual.options());
  float* h = residual.data_ptr<float>();
  float* xp = const_cast<float*>(x.data_ptr<float>());  // read only: no x to add
  const float* wx = w_x.data_ptr<float>();
  const float* wn = next ? w_next_opt->data_ptr<float>() : nullptr;
  float* dst = next ? out.data_ptr<float>() : nullptr;
  const float e = static_cast<float>(eps);
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> normed(static_cast<size_t>(width));
    for (int64_t r = r0; r < r1; ++r) {
      float* hr = h + r * width;
      float* xr = xp + r * width;
      scale_row(xr, add_inv_rms(xr, nullptr, width, e), wx, normed.data(), width);
      const float inv = add_inv_rms(hr, normed.data(), width, e);
      if (next) scale_row(hr, inv, wn, dst + r * width, width);
    }
  });
  return out;
}

at::Tensor silu_mul_f32(const at::Tensor& gate_up) {
  return gated_f32(gate_up, "silu_mul_f32", [](__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  });
}

// x * sigmoid(2 * sqrt(2 / pi) * (x + 0.044715 x^3)): GELU-tanh, since 0.5 * (1 + tanh(z)) = sigmoid(2z).
at::Tensor gelu_mul_f32(const at::Tensor& gate_up) {
  return gated_f32(gate_up, "gelu_mul_f32", [](__m256 x) {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 z = _mm256_mul_ps(_mm256_set1_ps(-1.5957691216057308f),  // -2 * sqrt(2 / pi)
                                   _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(z)));
  });
}

}  // namespace sarathi_kernels

#pragma GCC pop_options

namespace sarathi_kernels {

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("rms_norm_f32(Tensor x, Tensor w, float eps, Tensor? rows=None, bool bf16=False) -> Tensor", &rms_norm_f32);
  lib.def("silu_mul_f32(Tensor gate_up) -> Tensor", &silu_mul_f32);
  lib.def("gelu_mul_f32(Tensor gate_up) -> Tensor", &gelu_mul_f32);
  lib.def("norm_add_rms_norm_f32(Tensor(a!) residual, Tensor x, Tensor w_x, Tensor? w_next, float eps) -> Tensor",
          &norm_add_rms_norm_f32);
  lib.def("add_rms_norm_f32(Tensor(a!) residual, Tensor? x, Tensor weight, float eps) -> Tensor", &add_rms_norm_f32);
}

}  // namespace sarathi_kernels
