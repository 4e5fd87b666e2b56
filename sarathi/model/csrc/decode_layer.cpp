// Consecutive decoder layers of the Llama family for a batch of decodes only, with quantized linear layers: the
// kernels the Python layer calls (sarathi/model/llama.py, DecoderLayer's fused paths: plain pre-norm, or Gemma's
// sandwich norms; QK-norm where given), in the same order on the same tensors, so the result is bit for bit
// the same, in one call for the whole run of layers. At one sequence a layer's kernels take ~100 us and the
// Python between them (modules, wrappers, dispatch) ~50 us more; between layers, with the caches cold from the
// weights just streamed, each layer's call and the Python around it cost ~20 us more: this removes both.
//
// Per layer, in order: its norms (2, +2 with QK-norm, +2 with sandwich norms) in `norms`; 5 tensors per
// quantized segment (codes, d, sc, dm, mc, as sarathi/model/quantized.py packs them) in `weights`; 6 ints per
// segment (linear: 0 qkv, 1 o, 2 gate_up, 3 down; first output row; rows; bits; sub; zero) in `segments`; and
// in `layout` 5 ints: its number of segments, then the 4 linears' output widths. f32: the float32 layers' steps
// (float32 results: CPUs without AVX512-BF16), else the bf16 math's.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "kernel_ops.h"

namespace sarathi_kernels {
namespace {

constexpr int64_t kSegmentInts = 6;
constexpr int64_t kLayoutInts = 5;

// A layer's weights: its norms, 5 tensors and 6 ints per segment, and its 4 output widths.
struct LayerWeights {
  const at::Tensor* norms;
  const at::Tensor* tensors;
  const int64_t* segments;
  int64_t num_segments;
  const int64_t* widths;
};

at::Tensor linear(int64_t which, const at::Tensor& x, const LayerWeights& layer) {
  std::vector<int64_t> mine;
  for (int64_t s = 0; s < layer.num_segments; ++s)
    if (layer.segments[s * kSegmentInts] == which) mine.push_back(s);
  TORCH_CHECK(!mine.empty(), "decode_layers: no weight for linear ", which);
  const int64_t width = layer.widths[which];
  auto call = [&](int64_t s, at::Tensor* out) {
    const int64_t* g = layer.segments + s * kSegmentInts;
    const at::Tensor* w = layer.tensors + s * 5;
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

void decode_layer(at::Tensor& h, const LayerWeights& w, const at::Tensor& cos, const at::Tensor& sin,
                  at::Tensor k_cache, at::Tensor v_cache, const at::Tensor& slot_mapping,
                  const at::Tensor& block_tables, const at::Tensor& context_lens, int64_t heads, int64_t head_dim,
                  double scale, int64_t window, double eps, bool gelu, bool qk_norm, bool sandwich, bool f32) {
  const int64_t tokens = h.size(0), ff = qk_norm ? 4 : 2;
  std::optional<at::Tensor> q_norm, k_norm;
  if (qk_norm) q_norm = w.norms[2], k_norm = w.norms[3];
  // the steps with bf16 results (bf16 math) or float32 results (float32 layers: elementwise_avx2.cpp)
  auto add_norm = f32 ? &add_rms_norm_f32 : &add_rms_norm_bf16;
  auto norm_add_norm = f32 ? &norm_add_rms_norm_f32 : &norm_add_rms_norm_bf16;
  auto act_mul = gelu ? (f32 ? &gelu_mul_f32 : &gelu_mul_bf16) : (f32 ? &silu_mul_f32 : &silu_mul_bf16);
  at::Tensor x = add_norm(h, std::nullopt, w.norms[0], eps);
  at::Tensor qkv = linear(0, x, w).view({tokens, w.widths[0] / head_dim, head_dim});
  at::Tensor q =
      std::get<0>(rope_write_kv(qkv, cos, sin, k_cache, v_cache, slot_mapping, heads, false, q_norm, k_norm, eps));
  at::Tensor attn = linear(1, decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, window), w);
  x = sandwich ? norm_add_norm(h, attn, w.norms[1], w.norms[ff], eps) : add_norm(h, attn, w.norms[1], eps);
  at::Tensor gate_up = linear(2, x, w);
  at::Tensor y = linear(3, act_mul(gate_up), w);
  if (sandwich) {
    norm_add_norm(h, y, w.norms[ff + 1], std::nullopt, eps);
  } else {
    h.add_(y);
  }
}

}  // namespace

void decode_layers(at::Tensor& h, at::TensorList norms, at::TensorList weights, at::IntArrayRef segments,
                   at::IntArrayRef layout, const at::Tensor& cos, const at::Tensor& sin, at::TensorList k_caches,
                   at::TensorList v_caches, const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                   const at::Tensor& context_lens, int64_t heads, int64_t head_dim, double scale, int64_t window,
                   double eps, bool gelu, bool qk_norm, bool sandwich, bool f32) {
  const int64_t layers = static_cast<int64_t>(k_caches.size());
  const int64_t per_layer_norms = 2 + (qk_norm ? 2 : 0) + (sandwich ? 2 : 0);
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers, "decode_layers: one K and one V cache per layer expected");
  TORCH_CHECK(static_cast<int64_t>(layout.size()) == layers * kLayoutInts, "decode_layers: 5 layout ints per layer expected");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == layers * per_layer_norms, "decode_layers: wrong number of norms");
  int64_t total_segments = 0;
  for (int64_t l = 0; l < layers; ++l) total_segments += layout[l * kLayoutInts];
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == total_segments * 5 &&
                  static_cast<int64_t>(segments.size()) == total_segments * kSegmentInts,
              "decode_layers: 5 weight tensors and 6 ints per segment expected");
  int64_t first_segment = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* lay = layout.data() + l * kLayoutInts;
    const LayerWeights w{norms.data() + l * per_layer_norms, weights.data() + first_segment * 5,
                         segments.data() + first_segment * kSegmentInts, lay[0], lay + 1};
    decode_layer(h, w, cos, sin, k_caches[l], v_caches[l], slot_mapping, block_tables, context_lens, heads,
                 head_dim, scale, window, eps, gelu, qk_norm, sandwich, f32);
    first_segment += lay[0];
  }
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("decode_layers(Tensor(a!) h, Tensor[] norms, Tensor[] weights, int[] segments, int[] layout, Tensor cos, "
          "Tensor sin, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, Tensor slot_mapping, Tensor block_tables, "
          "Tensor context_lens, int heads, int head_dim, float scale, int window, float eps, bool gelu, bool qk_norm, "
          "bool sandwich, bool f32=False) -> ()",
          &decode_layers);
}

}  // namespace sarathi_kernels
