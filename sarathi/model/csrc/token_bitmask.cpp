// Structured outputs: the logits of tokens a grammar forbids become -inf, read from the matchers' packed
// bitmask (bit j of word w set: token 32w + j allowed). Unpacking 262,144-token masks with tensor ops costs
// ~30 ms at 32 rows; here a fully allowed word is one compare, and only forbidden tokens are written.

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace sarathi_kernels {

// logits float32 [B, V] (changed in place), bitmask int32 [R, words], rows int64 [R]: bitmask row k masks
// logits row rows[k]; tokens past 32 * words are forbidden.
void mask_logits_by_bitmask(at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.is_contiguous(),
              "mask_logits_by_bitmask: logits must be contiguous float32 [B, V]");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous(),
              "mask_logits_by_bitmask: bitmask must be contiguous int32 [R, words]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong && rows.numel() == bitmask.size(0),
              "mask_logits_by_bitmask: rows must be int64 [R], one per bitmask row");
  const int64_t batch = logits.size(0), vocab = logits.size(1), words = bitmask.size(1);
  const int64_t* rp = rows.data_ptr<int64_t>();
  for (int64_t k = 0; k < rows.numel(); ++k) {
    TORCH_CHECK(rp[k] >= 0 && rp[k] < batch, "mask_logits_by_bitmask: row ", rp[k], " outside the batch");
  }
  float* lp = logits.data_ptr<float>();
  const auto* bp = reinterpret_cast<const uint32_t*>(bitmask.data_ptr<int32_t>());
  at::parallel_for(0, rows.numel(), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      float* row = lp + rp[k] * vocab;
      const uint32_t* bits = bp + k * words;
      const int64_t covered = std::min(vocab, words * 32);
      for (int64_t w = 0; w * 32 < covered; ++w) {
        const uint32_t allowed = bits[w];
        if (allowed == 0xffffffffu) continue;
        const int64_t base = w * 32, end = std::min<int64_t>(32, covered - base);
        for (int64_t j = 0; j < end; ++j) {
          if (!((allowed >> j) & 1u)) row[base + j] = -INFINITY;
        }
      }
      std::fill(row + covered, row + vocab, -INFINITY);
    }
  });
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("mask_logits_by_bitmask(Tensor(a!) logits, Tensor bitmask, Tensor rows) -> ()", &mask_logits_by_bitmask);
}

}  // namespace sarathi_kernels
