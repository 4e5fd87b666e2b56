// One decoder layer of the Llama family for a batch of decodes only, with quantized linear layers: the kernels
// the Python layer calls (sarathi/model/llama.py, DecoderLayer's fused paths: plain pre-norm, or Gemma's
// sandwich norms; QK-norm where given), in the same order on the same tensors, so the result is bit for bit
// the same, in one call. At one sequence a layer's kernels take ~100 us
// and the Python between them (modules, wrappers, dispatch) ~50 us more: this removes most of the latter.
//
// weights: 5 tensors per quantized segment (codes, d, sc, dm, mc, as sarathi/model/quantized.py packs them);
// segments: 6 ints per segment (linear: 0 qkv, 1 o, 2 gate_up, 3 down; first output row; rows; bits; sub;
// zero); widths: the 4 linears' output widths. f32: the float32 layers' steps (float32 results: CPUs without
// AVX512-BF16), else the bf16 math's.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "kernel_ops.h"

namespace sarathi_kernels {
namespace {

constexpr int64_t kSegmentInts = 6;

at::Tensor linear(int64_t which, const at::Tensor& x, const std::vector<at::Tensor>& weights,
                  const std::vector<int64_t>& segments, int64_t width) {
  std::vector<int64_t> mine;
  for (int64_t s = 0; s < static_cast<int64_t>(segments.size()) / kSegmentInts; ++s)
    if (segments[s * kSegmentInts] == which) mine.push_back(s);
  TORCH_CHECK(!mine.empty(), "decode_layer: no weight for linear ", which);
  auto call = [&](int64_t s, at::Tensor* out) {
    const int64_t* g = segments.data() + s * kSegmentInts;
    const at::Tensor* w = weights.data() + s * 5;
    if (out == nullptr) return quant_linear(x, w[0], w[1], w[2], w[3], w[4], g[3], g[4], g[5], g[2]);
    at::Tensor part = out->narrow(1, g[1], g[2]);
    quant_gemm(x, w[0], w[1], w[2], w[3], w[4], g[3], g[4], g[5], part);
    return *out;
  };
  if (mine.size() == 1) return call(mine[0], nullptr);
  at::Tensor out = at::empty({x.size(0), width}, x.options().dtype(at::kFloat));
  for (int64_t s : mine) call(s, &out);
  return out;
}

}  // namespace

void decode_layer(at::Tensor& h, at::TensorList norms, at::TensorList weights_in, at::IntArrayRef segments_in,
                  at::IntArrayRef widths, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                  at::Tensor& v_cache, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                  const at::Tensor& context_lens, int64_t heads, int64_t head_dim, double scale, int64_t window,
                  double eps, bool gelu, bool qk_norm, bool sandwich, bool f32) {
  TORCH_CHECK(widths.size() == 4, "decode_layer: widths of qkv, o, gate_up and down expected");
  TORCH_CHECK(static_cast<int64_t>(segments_in.size()) == static_cast<int64_t>(weights_in.size()) / 5 * kSegmentInts &&
                  weights_in.size() % 5 == 0,
              "decode_layer: 5 weight tensors and 6 ints per segment expected");
  // norms: input, post-attention, then q and k (qk_norm), then pre- and post-feed-forward (sandwich)
  TORCH_CHECK(norms.size() == 2 + (qk_norm ? 2 : 0) + (sandwich ? 2 : 0), "decode_layer: wrong number of norms");
  const std::vector<at::Tensor> weights(weights_in.begin(), weights_in.end());
  const std::vector<int64_t> segments(segments_in.begin(), segments_in.end());
  const int64_t tokens = h.size(0), ff = qk_norm ? 4 : 2;
  std::optional<at::Tensor> q_norm, k_norm;
  if (qk_norm) q_norm = norms[2], k_norm = norms[3];
  // the steps with bf16 results (bf16 math) or float32 results (float32 layers: elementwise_avx2.cpp)
  auto add_norm = f32 ? &add_rms_norm_f32 : &add_rms_norm_bf16;
  auto norm_add_norm = f32 ? &norm_add_rms_norm_f32 : &norm_add_rms_norm_bf16;
  auto act_mul = gelu ? (f32 ? &gelu_mul_f32 : &gelu_mul_bf16) : (f32 ? &silu_mul_f32 : &silu_mul_bf16);
  at::Tensor x = add_norm(h, std::nullopt, norms[0], eps);
  at::Tensor qkv = linear(0, x, weights, segments, widths[0]).view({tokens, widths[0] / head_dim, head_dim});
  at::Tensor q =
      std::get<0>(rope_write_kv(qkv, cos, sin, k_cache, v_cache, slot_mapping, heads, false, q_norm, k_norm, eps));
  at::Tensor attn = linear(1, decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, window),
                           weights, segments, widths[1]);
  x = sandwich ? norm_add_norm(h, attn, norms[1], norms[ff], eps) : add_norm(h, attn, norms[1], eps);
  at::Tensor gate_up = linear(2, x, weights, segments, widths[2]);
  at::Tensor y = linear(3, act_mul(gate_up), weights, segments, widths[3]);
  if (sandwich) {
    norm_add_norm(h, y, norms[ff + 1], std::nullopt, eps);
  } else {
    h.add_(y);
  }
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("decode_layer(Tensor(a!) h, Tensor[] norms, Tensor[] weights, int[] segments, int[] widths, Tensor cos, "
          "Tensor sin, Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor slot_mapping, Tensor block_tables, "
          "Tensor context_lens, int heads, int head_dim, float scale, int window, float eps, bool gelu, bool qk_norm, "
          "bool sandwich, bool f32=False) -> ()",
          &decode_layer);
}

}  // namespace sarathi_kernels
