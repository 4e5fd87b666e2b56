// Consecutive decoder layers of the Llama family for a batch of decodes only, with quantized linear layers: the
// kernels the Python layer calls (sarathi/model/llama.py, DecoderLayer's fused paths: plain pre-norm, or Gemma's
// sandwich norms; QK-norm where given), in the same order on the same tensors, so the result is bit for bit
// the same, in one call for the whole run of layers. At one sequence a layer's kernels take ~100 us and the
// Python between them (modules, wrappers, dispatch) ~50 us more; between layers, with the caches cold from the
// weights just streamed, each layer's call and the Python around it cost ~20 us more: this removes both.
//
// A run's weights are registered once (decode_run_make, whose number the caller passes): per layer, in order, its norms (2,
// +2 with QK-norm, +2 with sandwich norms); 5 tensors per quantized segment (codes, d, sc, dm, mc, as
// sarathi/model/quantized.py packs them); 6 ints per segment (linear: 0 qkv, 1 o, 2 gate_up, 3 down; first
// output row; rows; bits; sub; zero); and 5 layout ints: its number of segments, then the 4 linears' output
// widths; and what the layers share (heads, head_dim, the attention scale, eps, the activation, QK-norm,
// sandwich norms, f32: the float32 layers' steps, float32 results on CPUs without AVX512-BF16, else the bf16
// math's). Passed as lists, a 1B model's ~370 weight tensors were converted on every call and released after
// it, on caches the streamed weights left cold: ~170 us of a one-sequence step (a custom class object took as
// long: torch converts one in ~10 us warm, ~200 us cold).
//
// The run that ends the model may also hold its final norm and LM head (decode_run_head): given the rows whose
// logits are wanted, the call then returns them, as RMSNorm.rows and Linear compute them (rms_norm_f32 over
// those rows, rounded to bf16 for bf16 math, then the head's quantized product), without the ~120 us the
// Python between the layers and the logits took at one sequence on cold caches.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <deque>
#include <mutex>
#include <optional>
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
  } else {  // h += y, as h.add_(y) adds, in a loop: at::add_'s dispatch and TensorIterator, cold each layer, cost more
    float* hp = h.data_ptr<float>();
    const float* yp = y.data_ptr<float>();
    for (int64_t i = 0, n = h.numel(); i < n; ++i) hp[i] += yp[i];
  }
}

}  // namespace

// A run of layers' weights and what they share (see the top of this file), checked once when made.
struct DecodeRunWeights {
  std::vector<at::Tensor> norms, weights;
  std::vector<int64_t> segments, layout;
  int64_t heads, head_dim, per_layer_norms;
  double scale, eps;
  bool gelu, qk_norm, sandwich, f32;

  // the final norm and the LM head (one linear: its segments' which = 0, widths[0] its output width)
  std::optional<at::Tensor> final_norm;
  double final_eps = 0.0;
  bool final_bf16 = false;
  std::vector<at::Tensor> head_weights;
  std::vector<int64_t> head_segments, head_widths;

  int64_t layers() const { return static_cast<int64_t>(layout.size()) / kLayoutInts; }
};

namespace {

// The runs made in this process, by number; a freed one's slot is emptied, its number not reused. Never
// destroyed: at exit their tensors are left to the process's end, not released during static destruction.
struct Runs {
  std::mutex mutex;
  std::deque<std::optional<DecodeRunWeights>> slots;  // a deque's elements stay where they are as it grows
};

Runs& runs() {
  static Runs* all = new Runs;
  return *all;
}

DecodeRunWeights& run_at(int64_t id) {
  Runs& all = runs();
  std::lock_guard<std::mutex> lock(all.mutex);
  TORCH_CHECK(id >= 0 && id < static_cast<int64_t>(all.slots.size()) && all.slots[id].has_value(),
              "decode_layers: no run ", id, " (freed, or never made)");
  return *all.slots[id];
}

}  // namespace

int64_t decode_run_make(std::vector<at::Tensor> norms, std::vector<at::Tensor> weights, std::vector<int64_t> segments,
                        std::vector<int64_t> layout, int64_t heads, int64_t head_dim, double scale, double eps,
                        bool gelu, bool qk_norm, bool sandwich, bool f32) {
  const int64_t per_layer_norms = 2 + (qk_norm ? 2 : 0) + (sandwich ? 2 : 0);
  TORCH_CHECK(!layout.empty() && layout.size() % kLayoutInts == 0, "decode_layers: 5 layout ints per layer expected");
  const int64_t layers = static_cast<int64_t>(layout.size()) / kLayoutInts;
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == layers * per_layer_norms, "decode_layers: wrong number of norms");
  int64_t total_segments = 0;
  for (int64_t l = 0; l < layers; ++l) total_segments += layout[l * kLayoutInts];
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == total_segments * 5 &&
                  static_cast<int64_t>(segments.size()) == total_segments * kSegmentInts,
              "decode_layers: 5 weight tensors and 6 ints per segment expected");
  Runs& all = runs();
  std::lock_guard<std::mutex> lock(all.mutex);
  all.slots.emplace_back(DecodeRunWeights{std::move(norms), std::move(weights), std::move(segments),
                                          std::move(layout), heads, head_dim, per_layer_norms, scale, eps, gelu,
                                          qk_norm, sandwich, f32});
  return static_cast<int64_t>(all.slots.size()) - 1;
}

// Gives run `id` the model's final norm (float32 [hidden], rms_norm_f32's `bf16` rounding) and its LM head (5
// tensors and 6 ints per quantized segment, as a layer's, linear 0, and its output width).
void decode_run_head(int64_t id, const at::Tensor& norm, double eps, bool bf16, std::vector<at::Tensor> weights,
                     std::vector<int64_t> segments, int64_t width) {
  TORCH_CHECK(!segments.empty() && static_cast<int64_t>(weights.size()) * kSegmentInts ==
                                       static_cast<int64_t>(segments.size()) * 5,
              "decode_run_head: 5 weight tensors and 6 ints per segment expected");
  for (size_t s = 0; s < segments.size(); s += kSegmentInts)
    TORCH_CHECK(segments[s] == 0, "decode_run_head: the head's segments are linear 0");
  DecodeRunWeights& r = run_at(id);
  std::lock_guard<std::mutex> lock(runs().mutex);
  r.final_norm = norm, r.final_eps = eps, r.final_bf16 = bf16;
  r.head_weights = std::move(weights), r.head_segments = std::move(segments), r.head_widths = {width, 0, 0, 0};
}

// Releases run `id`'s tensors (the caller's object for it is going away).
void decode_run_free(int64_t id) {
  Runs& all = runs();
  std::lock_guard<std::mutex> lock(all.mutex);
  if (id >= 0 && id < static_cast<int64_t>(all.slots.size())) all.slots[id].reset();
}

std::optional<at::Tensor> decode_layers(at::Tensor& h, int64_t run, const at::Tensor& cos, const at::Tensor& sin,
                                        at::TensorList k_caches, at::TensorList v_caches,
                                        const at::Tensor& slot_mapping, const at::Tensor& block_tables,
                                        const at::Tensor& context_lens, int64_t window,
                                        const std::optional<at::Tensor>& logits_rows) {
  const DecodeRunWeights& r = run_at(run);
  const int64_t layers = r.layers();
  TORCH_CHECK(static_cast<int64_t>(k_caches.size()) == layers && static_cast<int64_t>(v_caches.size()) == layers,
              "decode_layers: one K and one V cache per layer of the run expected (", layers, ")");
  TORCH_CHECK(!logits_rows || r.final_norm, "decode_layers: logits asked of a run without the model's head");
  int64_t first_segment = 0;
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* lay = r.layout.data() + l * kLayoutInts;
    const LayerWeights w{r.norms.data() + l * r.per_layer_norms, r.weights.data() + first_segment * 5,
                         r.segments.data() + first_segment * kSegmentInts, lay[0], lay + 1};
    decode_layer(h, w, cos, sin, k_caches[l], v_caches[l], slot_mapping, block_tables, context_lens, r.heads,
                 r.head_dim, r.scale, window, r.eps, r.gelu, r.qk_norm, r.sandwich, r.f32);
    first_segment += lay[0];
  }
  if (!logits_rows) return std::nullopt;
  const at::Tensor x = rms_norm_f32(h, *r.final_norm, r.final_eps, logits_rows, r.final_bf16);
  const LayerWeights head{nullptr, r.head_weights.data(), r.head_segments.data(),
                          static_cast<int64_t>(r.head_segments.size()) / kSegmentInts, r.head_widths.data()};
  return linear(0, x, head);
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("decode_run_make(Tensor[] norms, Tensor[] weights, int[] segments, int[] layout, int heads, int head_dim, "
          "float scale, float eps, bool gelu, bool qk_norm, bool sandwich, bool f32) -> int",
          &decode_run_make);
  lib.def("decode_run_head(int run, Tensor norm, float eps, bool bf16, Tensor[] weights, int[] segments, int width) "
          "-> ()",
          &decode_run_head);
  lib.def("decode_run_free(int run) -> ()", &decode_run_free);
  lib.def("decode_layers(Tensor(a!) h, int run, Tensor cos, Tensor sin, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, "
          "Tensor slot_mapping, Tensor block_tables, Tensor context_lens, int window, Tensor? logits_rows=None) "
          "-> Tensor?",
          &decode_layers);
}

}  // namespace sarathi_kernels
