// RMSNorm of float32 rows in one pass: y = x / sqrt(mean(x^2) + eps) * w. PyTorch's CPU rms_norm runs five
// elementwise ops, ~60 us a call for one 576-wide decode row on a Zen3, 61 calls a SmolLM2 step; this is the
// norm of the float32 layers (the AVX2 machines' path, where the fused bf16 kernels do not run). AVX2 code:
// the Python side calls it only where kernels.portable_available() (AVX2 or AVX-512) says so.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>

#pragma GCC target("avx2,fma")

namespace sarathi_kernels {
namespace {

void norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
    acc0 = _mm256_fmadd_ps(a, a, acc0);
    acc1 = _mm256_fmadd_ps(b, b, acc1);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(acc0, acc1));
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) sum += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(sum / static_cast<float>(n) + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = x[i] * inv * w[i];
}

}  // namespace

// x float32 [..., n] (contiguous), w float32 [n]: a new float32 tensor of x's shape.
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& w, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() >= 1, "rms_norm_f32: x must be contiguous float32");
  const int64_t n = x.size(-1);
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.is_contiguous() && w.dim() == 1 && w.size(0) == n,
              "rms_norm_f32: w must be float32 [", n, "]");
  at::Tensor y = at::empty_like(x);
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
  });
  return y;
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) { lib.def("rms_norm_f32(Tensor x, Tensor w, float eps) -> Tensor", &rms_norm_f32); }

}  // namespace sarathi_kernels
