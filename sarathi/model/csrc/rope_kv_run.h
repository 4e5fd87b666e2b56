// rope_write_kv's pass over the tokens, shared by its AVX-512 build (rope_kv.cpp) and its AVX2 build
// (rope_kv_avx2.cpp). `Lanes` is the build's vector: V (the register type), kWidth (floats in it), and
// load(p), store(float*, v), rotate(x, cos, sin, i, half) (x * cos rounded, then swap(x) * sin added in one
// fused multiply-add: bit for bit PyTorch's mul + addcmul), store_cache(T*, v) (rounded to the cache dtype,
// nearest even for bf16; returns the stored value widened to float32) and rms_norm_head(src, w, eps, d, dst).
//
// Include it under the including file's target pragma: its functions are in an anonymous namespace, so each
// build gets its own copy, compiled for its instruction set.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <cstdint>

namespace sarathi_kernels {
namespace {

constexpr int64_t kMaxHeadDim = 512;

template <typename Lanes, typename T>
void rope_kv_run(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                 at::Tensor& v_cache, const at::Tensor& slots, int64_t heads, at::Tensor& q_out, at::Tensor* k_out,
                 at::Tensor* v_out, const float* q_norm, const float* k_norm, float eps) {
  constexpr int64_t w = Lanes::kWidth;
  const int64_t tokens = qkv.size(0), rows = qkv.size(1), d = qkv.size(2), half = d / 2;
  const int64_t kv_heads = (rows - heads) / 2;
  const int64_t slots_per_head = k_cache.numel() / kv_heads / d;  // num_blocks * block_size
  const float* src = qkv.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  float* qo = q_out.data_ptr<float>();
  float* ko = k_out ? k_out->data_ptr<float>() : nullptr;
  float* vo = v_out ? v_out->data_ptr<float>() : nullptr;
  at::parallel_for(0, tokens, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const float* x = src + t * rows * d;
      const float* c = cp + t * d;
      const float* s = sp + t * d;
      alignas(64) float normed[kMaxHeadDim];
      for (int64_t h = 0; h < heads; ++h) {
        const float* q = x + h * d;
        if (q_norm) {
          Lanes::rms_norm_head(q, q_norm, eps, d, normed);
          q = normed;
        }
        for (int64_t i = 0; i < d; i += w) Lanes::store(qo + (t * heads + h) * d + i, Lanes::rotate(q, c, s, i, half));
      }
      for (int64_t g = 0; g < kv_heads; ++g) {
        const float* k = x + (heads + g) * d;
        if (k_norm) {
          Lanes::rms_norm_head(k, k_norm, eps, d, normed);
          k = normed;
        }
        const float* v = x + (heads + kv_heads + g) * d;
        T* kd = kc + (g * slots_per_head + slot[t]) * d;
        T* vd = vc + (g * slots_per_head + slot[t]) * d;
        for (int64_t i = 0; i < d; i += w) {
          const typename Lanes::V ks = Lanes::store_cache(kd + i, Lanes::rotate(k, c, s, i, half));
          const typename Lanes::V vs = Lanes::store_cache(vd + i, Lanes::load(v + i));
          if (ko) {
            Lanes::store(ko + (t * kv_heads + g) * d + i, ks);
            Lanes::store(vo + (t * kv_heads + g) * d + i, vs);
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace sarathi_kernels
