// RoPE's rotation tables for a batch of positions: cos = (cos a, cos a) and sin = (-sin a, sin a) over the two
// halves of head_dim, a = float32(position) * inv_freq[i] (one float32 product, as PyTorch forms it), float32
// [T, 1, head_dim]. Plain C++ for every CPU the extension runs on.
//
// One call in place of the ~11 small PyTorch ops of sarathi/model/rope.py's formula: at one sequence a decode
// step's ops run on caches the streamed weights left cold, ~8 us each. cos and sin are taken in double and
// rounded once, so each value is its float32 angle's cosine or sine correctly rounded, whatever the batch
// (PyTorch's float32 cos and sin can differ by an ulp between vectorized elements and a tensor's tail).

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <tuple>

namespace sarathi_kernels {

std::tuple<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, const at::Tensor& inv_freq) {
  TORCH_CHECK(positions.dim() == 1 && positions.scalar_type() == at::kLong, "rope_tables: positions int64 [T]");
  TORCH_CHECK(inv_freq.dim() == 1 && inv_freq.scalar_type() == at::kFloat, "rope_tables: inv_freq float32 [d/2]");
  const at::Tensor pos = positions.contiguous(), inv = inv_freq.contiguous();
  const int64_t tokens = pos.size(0), half = inv.size(0), d = 2 * half;
  at::Tensor cos = at::empty({tokens, 1, d}, inv.options()), sin = at::empty({tokens, 1, d}, inv.options());
  const int64_t* pp = pos.data_ptr<int64_t>();
  const float* fp = inv.data_ptr<float>();
  float* cp = cos.data_ptr<float>();
  float* sp = sin.data_ptr<float>();
  at::parallel_for(0, tokens, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float p = static_cast<float>(pp[t]);
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p * fp[i]);
        const float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
        cp[t * d + i] = cp[t * d + half + i] = c;
        sp[t * d + i] = -s;
        sp[t * d + half + i] = s;
      }
    }
  });
  return {cos, sin};
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("rope_tables(Tensor positions, Tensor inv_freq) -> (Tensor, Tensor)", &rope_tables);
}

}  // namespace sarathi_kernels
