// The kernels other kernels compose (defined in their own files), declared once.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace sarathi_kernels {

bool cpu_supported();  // AVX-512 with BF16 and VNNI: every kernel

at::Tensor add_rms_norm_bf16(at::Tensor& residual, const std::optional<at::Tensor>& x_opt, const at::Tensor& weight,
                             double eps);
at::Tensor norm_add_rms_norm_bf16(at::Tensor& residual, const at::Tensor& x_in, const at::Tensor& w_x,
                                  const std::optional<at::Tensor>& w_next_opt, double eps);
at::Tensor silu_mul_bf16(const at::Tensor& gate_up);
at::Tensor gelu_mul_bf16(const at::Tensor& gate_up);
// The same steps with float32 results (AVX2: elementwise_avx2.cpp), for float32 layers.
at::Tensor add_rms_norm_f32(at::Tensor& residual, const std::optional<at::Tensor>& x_opt, const at::Tensor& weight,
                            double eps);
at::Tensor norm_add_rms_norm_f32(at::Tensor& residual, const at::Tensor& x_in, const at::Tensor& w_x,
                                 const std::optional<at::Tensor>& w_next_opt, double eps);
at::Tensor silu_mul_f32(const at::Tensor& gate_up);
at::Tensor gelu_mul_f32(const at::Tensor& gate_up);
std::tuple<at::Tensor, at::Tensor, at::Tensor> rope_write_kv(const at::Tensor& qkv_in, const at::Tensor& cos_in,
                                                             const at::Tensor& sin_in, at::Tensor& k_cache,
                                                             at::Tensor& v_cache, const at::Tensor& slot_mapping,
                                                             int64_t heads, bool return_kv,
                                                             const std::optional<at::Tensor>& q_norm,
                                                             const std::optional<at::Tensor>& k_norm, double eps);
at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& block_tables, const at::Tensor& context_lens, double scale,
                            int64_t window);
// rope_write_kv's AVX2 build, on inputs rope_write_kv has checked and made contiguous (k_out, v_out: null
// when not returned; q_norm, k_norm: null without QK-norm).
void rope_write_kv_avx2(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                        at::Tensor& v_cache, const at::Tensor& slots, int64_t heads, at::Tensor& q_out,
                        at::Tensor* k_out, at::Tensor* v_out, const float* q_norm, const float* k_norm, float eps);
// decode_attention's AVX2 build, on inputs decode_attention has checked (q float32, tables and lens int64).
void decode_attention_avx2(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& tables, const at::Tensor& lens, double scale, int64_t window,
                           at::Tensor& out);
// int8_rows: rows of x up to which the int8 path runs; -1 for this CPU's choice (quant_int8_rows).
void quant_gemm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                const at::Tensor& dm, const at::Tensor& mc, int64_t bits, int64_t sub, int64_t zero, at::Tensor& out,
                int64_t int8_rows = -1);
at::Tensor rms_norm_f32(const at::Tensor& x, const at::Tensor& w, double eps, const std::optional<at::Tensor>& rows,
                        bool bf16);
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                        const at::Tensor& dm, const at::Tensor& mc, int64_t bits, int64_t sub, int64_t zero, int64_t n);

}  // namespace sarathi_kernels
