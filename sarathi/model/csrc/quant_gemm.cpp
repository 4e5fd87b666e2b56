// y[M, N] (float32) = x[M, K] (bf16, or float32 rounded to bf16) @ W[N, K]^T for a weight kept in a GGUF
// quantization (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), never dequantized in memory.
//
// Every such format stores, per sub-block of 16 or 32 weights of a row, small integer codes q and scales:
//     w = s * (q - z) + m,   s = d (* sc),   m = dm (* mc)
// with d, dm float16 (per block, or per 256-weight super-block for k-quants) and sc, mc small integers (per
// sub-block, k-quants only). The kernel turns codes into bf16 in registers (exact: |q - z| <= 255), multiplies
// them against bf16 x with VDPBF16PS (float32 sums), and applies the scales once per sub-block:
//     sum_k w x = s * sum_k (q - z) x + m * sum_k x.
// So the values multiplied are exactly the file's weights, with x rounded to bf16 as in our bf16 GEMM.
//
// Packed layout, per tile of 16 output columns and per group of 32 input positions (16 pairs), made by
// sarathi/model/quantized.py: the bf16 register for pair p holds lanes 2c + j = weight (column c, position
// 2p + j), which is what VDPBF16PS multiplies against a broadcast pair of x (as in bf16_gemm.cpp).
//   4-bit: 256 bytes; byte b of row g (g < 8) = code(pair g, lane b) | code(pair g + 8, lane b) << 4
//   5-bit: those 256 bytes, then 16 uint32 (bit b of word p: bit 4 of code(pair p, lane b))
//   6-bit: as 5-bit, then 16 more uint32 for bit 5
//   8-bit: 512 int8, (pair, lane), already q - z.
// Scales: d, dm float16 [tiles, super-blocks, 16]; sc int8 and mc uint8 [tiles, sub-blocks, 16].

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

namespace sarathi_kernels {
namespace {

constexpr int kCols = 16;          // output columns per tile (one zmm of float32)
constexpr int kGroup = 32;         // input positions per code group
constexpr int kPairs = kGroup / 2;
constexpr int kChunkGroups = 8;    // groups decoded at a time per tile into the per-thread scratch (16 KiB)
constexpr int kMaxRows = 4;        // rows of x per register tile (measured on a Zen4 against 6 x 1, 6 x 2, 2 x 4)
constexpr int kMaxTiles = 2;       // tiles of 16 columns per register tile: 4 x 2 x 2 accumulators

int group_bytes(int bits) { return bits == 8 ? 512 : 256 + (bits - 4) * 64; }

struct Weight {
  const uint8_t* codes;
  const uint16_t* d;
  const int8_t* sc;
  const uint16_t* dm;
  const uint8_t* mc;
  int64_t groups, subs, supers;  // per tile
  int bits, zero;
};

// Codes of one group (16 pairs x 32 lanes) -> bf16 values q - z into scratch.
template <int BITS>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void decode_group(
    const uint8_t* codes, uint16_t* out, const uint16_t* lut) {
  const __m512i lut0 = _mm512_loadu_si512(lut), lut1 = _mm512_loadu_si512(lut + 32);
  if constexpr (BITS == 8) {
    for (int p = 0; p < kPairs; ++p) {
      const auto* c = reinterpret_cast<const __m128i*>(codes + p * 32);
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c)));
      const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(c + 1)));
      _mm512_storeu_si512(out + p * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  } else {
    const __m512i nibble = _mm512_set1_epi16(15);
    const auto* bit4 = reinterpret_cast<const uint32_t*>(codes + 256);
    const auto* bit5 = reinterpret_cast<const uint32_t*>(codes + 320);
    for (int g = 0; g < kPairs / 2; ++g) {
      const __m512i v = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * g)));
      __m512i idx[2] = {_mm512_and_si512(v, nibble), _mm512_srli_epi16(v, 4)};
      for (int h = 0; h < 2; ++h) {
        const int p = g + 8 * h;
        if constexpr (BITS >= 5) idx[h] = _mm512_mask_add_epi16(idx[h], bit4[p], idx[h], _mm512_set1_epi16(16));
        if constexpr (BITS == 6) idx[h] = _mm512_mask_add_epi16(idx[h], bit5[p], idx[h], _mm512_set1_epi16(32));
        const __m512i w = BITS == 6 ? _mm512_permutex2var_epi16(lut0, idx[h], lut1)
                                    : _mm512_permutexvar_epi16(idx[h], lut0);
        _mm512_storeu_si512(out + p * 32, w);
      }
    }
  }
}

// 16 float16 values, widened to float32.
__attribute__((target("avx512f"))) inline __m512 halves16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 small integers (signed or unsigned bytes), as float32.
__attribute__((target("avx512f"))) inline __m512 bytes16(const int8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
__attribute__((target("avx512f"))) inline __m512 bytes16(const uint8_t* p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// MR rows of x against NB tiles' decoded chunk of `ngroups` groups starting at group g0 (scratch holds tile j's
// groups at j * tile_stride); accumulates into y (columns of tile0 onwards, `cols` of them valid).
template <int MR, int NB, int SUB, bool SC, bool MIN>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_chunk(
    const int32_t* x, int64_t ldx_pairs, const float* xsum, int64_t ldsum, const uint16_t* scratch,
    int64_t tile_stride, int ngroups, int64_t g0, const Weight& w, int64_t tile0, float* y, int64_t ldy, int64_t cols,
    bool first) {
  constexpr int kSubsPerGroup = kGroup / SUB;
  const int64_t subs_per_super = w.subs / w.supers;
  __mmask16 mask[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const int64_t left = cols - j * kCols;
    mask[j] = left >= kCols ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
  }
  __m512 acc[MR][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      acc[i][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y + i * ldy + j * kCols);
  for (int g = 0; g < ngroups; ++g) {
#pragma GCC unroll 2
    for (int s = 0; s < kSubsPerGroup; ++s) {
      const int64_t sub = (g0 + g) * kSubsPerGroup + s, sup = sub / subs_per_super;
      __m512 tmp[MR][NB];
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) tmp[i][j] = _mm512_setzero_ps();
      const int64_t pair0 = (g0 + g) * kPairs + s * (SUB / 2);
      const uint16_t* wrow = scratch + (g * kPairs + s * (SUB / 2)) * 32;
#pragma GCC unroll 2
      for (int p = 0; p < SUB / 2; ++p) {
        __m512bh wv[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wrow + j * tile_stride + p * 32);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[i * ldx_pairs + pair0 + p]);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) tmp[i][j] = _mm512_dpbf16_ps(tmp[i][j], xv, wv[j]);
        }
      }
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const int64_t tile = tile0 + j;
        const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
        __m512 scale = halves16(w.d + super_at);
        if constexpr (SC) scale = _mm512_mul_ps(scale, bytes16(w.sc + sub_at));
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(tmp[i][j], scale, acc[i][j]);
        if constexpr (MIN) {
          __m512 shift = halves16(w.dm + super_at);
          if constexpr (SC) shift = _mm512_mul_ps(shift, bytes16(w.mc + sub_at));
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i)
            acc[i][j] = _mm512_fmadd_ps(shift, _mm512_set1_ps(xsum[i * ldsum + sub]), acc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(y + i * ldy + j * kCols, mask[j], acc[i][j]);
}

using RowsFn = void (*)(const int32_t*, int64_t, const float*, int64_t, const uint16_t*, int64_t, int, int64_t,
                        const Weight&, int64_t, float*, int64_t, int64_t, bool);

template <int SUB, bool SC, bool MIN>
struct RowTable {
  RowsFn fn[kMaxRows + 1][kMaxTiles + 1] = {};
  template <int MR, int NB>
  void put() {
    fn[MR][NB] = &rows_chunk<MR, NB, SUB, SC, MIN>;
  }
  template <int MR, int... NBs>
  void put_row(std::integer_sequence<int, NBs...>) {
    (put<MR, NBs + 1>(), ...);
  }
  template <int... MRs>
  void put_all(std::integer_sequence<int, MRs...>) {
    (put_row<MRs + 1>(std::make_integer_sequence<int, kMaxTiles>{}), ...);
  }
  RowTable() { put_all(std::make_integer_sequence<int, kMaxRows>{}); }
};

template <int BITS, int SUB, bool SC, bool MIN>
void run(const int32_t* x, int64_t m, int64_t k, const float* xsum, const Weight& w, float* y, int64_t ldy,
         int64_t n) {
  static const RowTable<SUB, SC, MIN> table;
  uint16_t lut_values[64];
  for (int i = 0; i < 64; ++i) {
    const float v = static_cast<float>(i - w.zero);  // exact in bf16: the top 16 bits of the float
    uint32_t bitsv;
    std::memcpy(&bitsv, &v, 4);
    lut_values[i] = static_cast<uint16_t>(bitsv >> 16);
  }
  const int64_t tiles = (n + kCols - 1) / kCols, ldx_pairs = k / 2, ldsum = k / SUB;
  const int64_t bytes = group_bytes(BITS), tile_stride = kChunkGroups * kPairs * 32;
  const int64_t tile_groups = (tiles + kMaxTiles - 1) / kMaxTiles;
  at::parallel_for(0, tile_groups, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) uint16_t scratch[kMaxTiles * kChunkGroups * kPairs * 32];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t tile0 = q * kMaxTiles;
      const int nb = static_cast<int>(std::min<int64_t>(kMaxTiles, tiles - tile0));
      const int64_t col0 = tile0 * kCols, cols = std::min<int64_t>(n - col0, nb * kCols);
      for (int64_t g0 = 0; g0 < w.groups; g0 += kChunkGroups) {
        const int ng = static_cast<int>(std::min<int64_t>(kChunkGroups, w.groups - g0));
        for (int j = 0; j < nb; ++j)
          for (int g = 0; g < ng; ++g)
            decode_group<BITS>(w.codes + ((tile0 + j) * w.groups + g0 + g) * bytes,
                               scratch + j * tile_stride + g * kPairs * 32, lut_values);
        for (int64_t r = 0; r < m; r += kMaxRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
          table.fn[mr][nb](x + r * ldx_pairs, ldx_pairs, MIN ? xsum + r * ldsum : nullptr, ldsum, scratch,
                           tile_stride, ng, g0, w, tile0, y + r * ldy + col0, ldy, cols, g0 == 0);
        }
      }
    }
  });
}

const uint16_t* half_ptr(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }

}  // namespace

// x [M, K] bf16 or float32; codes uint8 [tiles, K/32, bytes]; d, dm float16 [tiles, supers, 16] (dm empty
// without offsets); sc int8, mc uint8 [tiles, K/sub, 16] (empty for non-k-quants); out float32 [M, N] (rows
// may be strided: a column slice of a wider output) is overwritten with x @ W^T.
void quant_gemm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                const at::Tensor& dm, const at::Tensor& mc, int64_t bits, int64_t sub, int64_t zero, at::Tensor& out) {
  TORCH_CHECK(x_in.dim() == 2, "quant_gemm: x must be 2-D");
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kFloat && out.stride(1) == 1 && out.size(0) == x_in.size(0),
              "quant_gemm: out must be float32 [M, N] with unit column stride");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous(), "quant_gemm: bad codes");
  TORCH_CHECK(bits == 4 || bits == 5 || bits == 6 || bits == 8, "quant_gemm: unsupported code width ", bits);
  TORCH_CHECK(codes.size(2) == group_bytes(static_cast<int>(bits)), "quant_gemm: codes do not match ", bits, " bits");
  const at::Tensor x = x_in.to(at::kBFloat16).contiguous();
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  TORCH_CHECK(k == codes.size(1) * kGroup, "quant_gemm: x has ", k, " features, the weight ", codes.size(1) * kGroup);
  TORCH_CHECK(codes.size(0) == (n + kCols - 1) / kCols, "quant_gemm: out has ", n, " columns, the weight ",
              codes.size(0), " tiles");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 3 && d.size(0) == codes.size(0),
              "quant_gemm: bad d");
  const bool has_sc = sc.numel() > 0, has_min = dm.numel() > 0;
  Weight w{codes.data_ptr<uint8_t>(), half_ptr(d), nullptr, nullptr, nullptr, codes.size(1), k / sub, d.size(1),
           static_cast<int>(bits), static_cast<int>(zero)};
  TORCH_CHECK(sub == 16 || sub == 32, "quant_gemm: sub-block size must be 16 or 32");
  TORCH_CHECK(w.supers > 0 && w.subs % w.supers == 0, "quant_gemm: d does not divide the sub-blocks");
  if (has_sc) {
    TORCH_CHECK(sc.scalar_type() == at::kChar && sc.is_contiguous() && sc.numel() == codes.size(0) * w.subs * kCols,
                "quant_gemm: bad sc");
    w.sc = sc.data_ptr<int8_t>();
  }
  if (has_min) {
    TORCH_CHECK(dm.scalar_type() == at::kHalf && dm.is_contiguous() && dm.sizes() == d.sizes(), "quant_gemm: bad dm");
    w.dm = half_ptr(dm);
    if (has_sc) {
      TORCH_CHECK(mc.scalar_type() == at::kByte && mc.is_contiguous() && mc.numel() == sc.numel(),
                  "quant_gemm: bad mc");
      w.mc = mc.data_ptr<uint8_t>();
    }
  }
  if (m == 0) return;
  const auto* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  at::Tensor xsum;
  if (has_min) {  // sums of the bf16 x over each sub-block, for the offset term
    xsum = x.to(at::kFloat).view({m, k / sub, sub}).sum(-1).contiguous();
  }
  const float* sp = has_min ? xsum.data_ptr<float>() : nullptr;
  float* yp = out.data_ptr<float>();
  const int64_t ldy = out.stride(0);
  const int key = static_cast<int>(bits) * 1000 + static_cast<int>(sub) * 10 + (has_sc ? 2 : 0) + (has_min ? 1 : 0);
  switch (key) {
    case 4320: run<4, 32, false, false>(xp, m, k, sp, w, yp, ldy, n); break;  // Q4_0
    case 4321: run<4, 32, false, true>(xp, m, k, sp, w, yp, ldy, n); break;   // Q4_1
    case 5320: run<5, 32, false, false>(xp, m, k, sp, w, yp, ldy, n); break;  // Q5_0
    case 5321: run<5, 32, false, true>(xp, m, k, sp, w, yp, ldy, n); break;   // Q5_1
    case 8320: run<8, 32, false, false>(xp, m, k, sp, w, yp, ldy, n); break;  // Q8_0
    case 4323: run<4, 32, true, true>(xp, m, k, sp, w, yp, ldy, n); break;    // Q4_K
    case 5323: run<5, 32, true, true>(xp, m, k, sp, w, yp, ldy, n); break;    // Q5_K
    case 6162: run<6, 16, true, false>(xp, m, k, sp, w, yp, ldy, n); break;   // Q6_K
    default: TORCH_CHECK(false, "quant_gemm: no kernel for ", bits, "-bit codes, sub-block ", sub,
                         has_sc ? ", sub-block scales" : "", has_min ? ", offsets" : "");
  }
}

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("quant_gemm(Tensor x, Tensor codes, Tensor d, Tensor sc, Tensor dm, Tensor mc, int bits, int sub, int zero, "
          "Tensor(a!) out) -> ()",
          &quant_gemm);
}

}  // namespace sarathi_kernels
