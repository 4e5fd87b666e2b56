// Rows of a weight kept in a GGUF quantization (the packed layout of quant_gemm.cpp), dequantized to float32:
// the embedding lookup of a quantized token table, which for tied embeddings is the LM head's own weight, so
// the table is held once, in the file's bytes.
//
// Every value is w = d (* sc) * (q - z) + dm (* mc), as the gguf package dequantizes it: the products of a
// float16 scale, a 6-bit multiplier and a code are exact in float32, so the only rounding is the final sum,
// as in a float64 reference rounded to float32.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>

#include "quant_layout.h"

namespace sarathi_kernels {
namespace {

// The code of column c at position p (< 32) of one group, as the integer q - z (IQ4's: the table's value).
inline int code_at(const uint8_t* group, int bits, int zero, int c, int p) {
  const int r = p / 4, j = 4 * c + p % 4;
  if (bits == 8) return static_cast<int8_t>(group[64 * r + j] ^ 0x80);
  if (bits < 4) {
    int v = (group[64 * (r / 4) + j] >> (2 * (r % 4))) & 3;
    if (bits == 3) v |= ((group[128 + j] >> r) & 1) << 2;
    return v - zero;
  }
  if (bits == 6) {
    if (r < 4) return (group[64 * r + j] & 0x3F) - zero;
    const uint8_t nibbles = group[256 + 64 * ((r - 4) / 2) + j];
    return (((r % 2 ? nibbles >> 4 : nibbles) & 0x0F) | ((group[64 * (r - 4) + j] >> 6) << 4)) - zero;
  }
  const uint8_t low = group[64 * (r & 3) + j];
  int v = r < 4 ? (low & 0x0F) : (low >> 4);
  if (bits == kIq4Codes) return kIq4Values[v];
  if (bits == 5) v |= ((group[256 + j] >> r) & 1) << 4;
  return v - zero;
}

}  // namespace

// ids int64 [n] (each < rows); codes uint8 [tiles, K/32, bytes]; d, dm float16 [tiles, supers, 16] (dm
// empty without offsets); sc int8, mc uint8 [tiles, K/sub, 16] (empty for non-k-quants). Returns float32
// [n, K]: row ids[i] of the weight.
at::Tensor quant_rows(const at::Tensor& ids_in, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                      const at::Tensor& dm, const at::Tensor& mc, int64_t rows, int64_t bits, int64_t sub,
                      int64_t zero) {
  TORCH_CHECK(known_code_kind(bits), "quant_rows: unsupported code width ", bits);
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(2) == group_bytes(static_cast<int>(bits)),
              "quant_rows: bad codes");
  TORCH_CHECK(sub == 16 || sub == 32, "quant_rows: sub-block size must be 16 or 32");
  const int64_t tiles = codes.size(0), groups = codes.size(1), k = groups * kGroup, subs = k / sub;
  TORCH_CHECK(rows > 0 && rows <= tiles * kCols, "quant_rows: ", rows, " rows do not fit ", tiles, " tiles");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 3 && d.size(0) == tiles &&
                  d.size(2) == kCols && d.size(1) > 0 && k % d.size(1) == 0,
              "quant_rows: bad d");
  const int64_t supers = d.size(1), block = k / supers;
  const bool has_sc = sc.numel() > 0, has_min = dm.numel() > 0;
  TORCH_CHECK(!has_sc || (sc.scalar_type() == at::kChar && sc.is_contiguous() && sc.numel() == tiles * subs * kCols),
              "quant_rows: bad sc");
  TORCH_CHECK(!has_min || (dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.sizes() == d.sizes()),
              "quant_rows: bad dm");
  TORCH_CHECK(!(has_sc && has_min) || (mc.scalar_type() == at::kByte && mc.is_contiguous() && mc.numel() == sc.numel()),
              "quant_rows: bad mc");
  const at::Tensor ids = ids_in.to(at::kLong).contiguous().view(-1);
  const int64_t n = ids.size(0);
  const int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(idp[i] >= 0 && idp[i] < rows, "quant_rows: id ", idp[i], " is outside [0, ", rows, ")");
  at::Tensor out = at::empty({n, k}, at::kFloat);
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const at::Half* dp = d.data_ptr<at::Half>();
  const at::Half* dmp = has_min ? dm.data_ptr<at::Half>() : nullptr;
  const int8_t* scp = has_sc ? sc.data_ptr<int8_t>() : nullptr;
  const uint8_t* mcp = has_sc && has_min ? mc.data_ptr<uint8_t>() : nullptr;
  float* op = out.data_ptr<float>();
  const int gb = group_bytes(static_cast<int>(bits)), b = static_cast<int>(bits), z = static_cast<int>(zero);
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t t = idp[i] / kCols;
      const int c = static_cast<int>(idp[i] % kCols);
      float* row = op + i * k;
      // scale and shift once per sub-block, not per value (1B's Q6_K table, random rows, one thread: 8.1-8.6 ->
      // 5.7-6.2 us a row, bit for bit the same)
      for (int64_t s = 0; s < subs; ++s) {
        const int64_t sb = s * sub / block;
        float scale = static_cast<float>(dp[(t * supers + sb) * kCols + c]);
        if (scp) scale *= static_cast<float>(scp[(t * subs + s) * kCols + c]);
        float shift = 0.0f;
        if (dmp) {
          shift = static_cast<float>(dmp[(t * supers + sb) * kCols + c]);
          if (mcp) shift *= static_cast<float>(mcp[(t * subs + s) * kCols + c]);
        }
        for (int64_t pos = s * sub; pos < (s + 1) * sub; ++pos) {
          const uint8_t* group = cp + (t * groups + pos / kGroup) * gb;
          const float w = scale * static_cast<float>(code_at(group, b, z, c, static_cast<int>(pos % kGroup)));
          row[pos] = dmp ? w + shift : w;
        }
      }
    }
  });
  return out;
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("quant_rows(Tensor ids, Tensor codes, Tensor d, Tensor sc, Tensor dm, Tensor mc, int rows, int bits, "
          "int sub, int zero) -> Tensor",
          &quant_rows);
}

}  // namespace sarathi_kernels
