// y[M, N] (float32) = x[M, K] (bf16, or float32 rounded to bf16) @ W[N, K]^T (bf16) + bias (float32),
// products summed in float32 by AVX512-BF16's VDPBF16PS: what a GPU's bf16 GEMM and llama.cpp's BF16 do.
//
// PyTorch's CPU bf16 matmuls round their output to bf16 (one more rounding per layer than this scheme's
// floor); this kernel keeps it float32 and reads a weight laid out for VDPBF16PS, without padding K.
//
// On a CPU with AMX tiles (Xeon Sapphire Rapids on), from 2 rows of x and K a multiple of 32, TDPBF16PS does
// the same products, 16 x 16 x 32 per instruction (amx_tiles.h).
//
// Packed weight layout: [N/16][K/2][16][2] bf16. One 64-byte load holds, for 16 output columns, the two
// weights of one pair of input positions, which is what VDPBF16PS multiplies against a broadcast pair of x.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "amx_tiles.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace sarathi_kernels {
namespace {

constexpr int64_t kColsPerBlock = 16;  // output columns per zmm register
constexpr int kMaxRows = 6;           // rows of x per register tile
constexpr int kMaxBlocks = 4;         // 16-column blocks per register tile (6 x 4 accumulators + 4 weights)
// On AMX tiles (amx_tiles.h) a thread takes 4 blocks at a time (at K = 8,192, 1 MiB of weights: in L2 while
// every 32 rows of x pass over it), from kAmxRows rows of x up. On a 2-core Xeon (family 6 model 167), Llama 3.2
// 1B's MLP weights from memory, the tiles took 1.03x the time of the register tiles at 1 row (both stream the
// weight), 0.87x at 4 rows, 0.59x at 8, 0.26x at 16 and 0.13x at 256 (1,390 GFLOP/s against 183).
constexpr int kAmxBlocks = 4;
constexpr int64_t kAmxRows = 2;

using TileFn = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, int64_t,
                        const float*, int64_t);

// One register tile: MR rows x NB blocks of 16 columns, over all K/2 pairs.
template <int MR, int NB>
__attribute__((target("avx512f,avx512bf16"))) void tile(
    const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t block_stride, int64_t pairs, float* y,
    int64_t ldy, const float* bias, int64_t cols) {
  __m512 acc[MR][NB];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  const int32_t* rows[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) rows[i] = reinterpret_cast<const int32_t*>(x + i * ldx);
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh wv[NB];
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j)
      wv[j] = (__m512bh)_mm512_loadu_si512(w + j * block_stride + p * 2 * kColsPerBlock);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(rows[i][p]);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < NB; ++j) {
    const int64_t left = cols - j * kColsPerBlock;
    const __mmask16 mask = left >= kColsPerBlock ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + j * kColsPerBlock) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
      _mm512_mask_storeu_ps(y + i * ldy + j * kColsPerBlock, mask, _mm512_add_ps(acc[i][j], b));
  }
}

template <int MR, int... NBs>
constexpr void fill_row(TileFn (&table)[kMaxRows + 1][kMaxBlocks + 1], std::integer_sequence<int, NBs...>) {
  ((table[MR][NBs + 1] = &tile<MR, NBs + 1>), ...);
}

template <int... MRs>
constexpr void fill_table(TileFn (&table)[kMaxRows + 1][kMaxBlocks + 1], std::integer_sequence<int, MRs...>) {
  (fill_row<MRs + 1>(table, std::make_integer_sequence<int, kMaxBlocks>{}), ...);
}

struct TileTable {
  TileFn fn[kMaxRows + 1][kMaxBlocks + 1] = {};
  TileTable() { fill_table(fn, std::make_integer_sequence<int, kMaxRows>{}); }
};

const TileTable& tiles() {
  static const TileTable table;
  return table;
}

}  // namespace

// Whether this CPU executes AVX-512 with BF16 (every kernel of the extension).
bool cpu_supported() {
  // SARATHI_KERNELS=avx2, vnni or avx512bw: run as a CPU without AVX512-BF16 would (to test and time those paths here).
  const char* choice = std::getenv("SARATHI_KERNELS");
  if (choice != nullptr && (std::strcmp(choice, "avx2") == 0 || std::strcmp(choice, "vnni") == 0 ||
                            std::strcmp(choice, "avx512bw") == 0))
    return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

// W [N, K] -> out [ceil(N/16), K/2, 16, 2] bf16 (rows past N are zero); the caller places out (on huge pages:
// sarathi/model/huge_pages.py).
void bf16_gemm_pack(const at::Tensor& weight, at::Tensor& out) {
  TORCH_CHECK(weight.dim() == 2, "bf16_gemm_pack: weight must be 2-D, got ", weight.dim(), "-D");
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(k % 2 == 0, "bf16_gemm_pack: in_features must be even, got ", k);
  const int64_t blocks = (n + kColsPerBlock - 1) / kColsPerBlock;
  const std::vector<int64_t> shape = {blocks, k / 2, kColsPerBlock, 2};
  TORCH_CHECK(out.sizes() == at::IntArrayRef(shape) && out.scalar_type() == at::kBFloat16 && out.is_contiguous(),
              "bf16_gemm_pack: out must be a contiguous bf16 tensor of shape ", at::IntArrayRef(shape));
  at::Tensor rows = out.permute({0, 2, 1, 3});  // [blocks, 16, K/2, 2]: block b's column c is W's row 16 b + c
  const int64_t full = n / kColsPerBlock, left = n - full * kColsPerBlock;
  if (full > 0)
    rows.narrow(0, 0, full).copy_(weight.narrow(0, 0, full * kColsPerBlock).reshape({full, kColsPerBlock, k / 2, 2}));
  if (left > 0) {
    at::Tensor last = rows.select(0, full);
    last.zero_();
    last.narrow(0, 0, left).copy_(weight.narrow(0, full * kColsPerBlock, left).reshape({left, k / 2, 2}));
  }
}

// x [M, K] bf16 or float32, packed from bf16_gemm_pack, bias [N] float32 or None -> y [M, N] float32.
at::Tensor bf16_gemm(const at::Tensor& x_in, const at::Tensor& packed, int64_t n,
                     const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x_in.dim() == 2, "bf16_gemm: x must be 2-D");
  TORCH_CHECK(packed.dim() == 4 && packed.scalar_type() == at::kBFloat16 && packed.is_contiguous(),
              "bf16_gemm: weight must come from bf16_gemm_pack");
  const at::Tensor x = x_in.to(at::kBFloat16).contiguous();
  const int64_t m = x.size(0), k = x.size(1), blocks = packed.size(0), pairs = packed.size(1);
  TORCH_CHECK(k == 2 * pairs, "bf16_gemm: x has ", k, " features, the weight ", 2 * pairs);
  TORCH_CHECK(n <= blocks * kColsPerBlock && n > (blocks - 1) * kColsPerBlock, "bf16_gemm: bad n ", n);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->to(at::kFloat).contiguous();
    TORCH_CHECK(b.numel() == n, "bf16_gemm: bias has ", b.numel(), " values, expected ", n);
  }
  at::Tensor y = at::empty({m, n}, x.options().dtype(at::kFloat));
  if (m == 0) return y;
  const auto* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>());
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t block_stride = pairs * 2 * kColsPerBlock;
  if (m >= kAmxRows && k % 32 == 0 && amx_bf16_ready()) {
    at::Tensor padded = x;  // tiles read 16 rows at a time
    if (m % 16 != 0) {
      padded = at::zeros({(m + 15) / 16 * 16, k}, x.options());
      padded.narrow(0, 0, m).copy_(x);
    }
    const auto* xa = reinterpret_cast<const uint16_t*>(padded.data_ptr<at::BFloat16>());
    at::parallel_for(0, (blocks + kAmxBlocks - 1) / kAmxBlocks, 1, [&](int64_t t0, int64_t t1) {
      amx_begin();
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t block0 = t * kAmxBlocks;
        const int nb = static_cast<int>(std::min<int64_t>(kAmxBlocks, blocks - block0));
        const int64_t col0 = block0 * kColsPerBlock, cols = std::min<int64_t>(n - col0, nb * kColsPerBlock);
        amx_rows(xa, k, m, wp + block0 * block_stride, block_stride, nb, k / 32, yp + col0, n, cols, true);
      }
      amx_end();
    });
    if (b.defined()) y.add_(b);
    return y;
  }
  const int64_t col_tiles = (blocks + kMaxBlocks - 1) / kMaxBlocks;
  const auto& table = tiles();
  // Threads split the columns (each streams its own part of the weight once per pass over the rows).
  at::parallel_for(0, col_tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t block0 = t * kMaxBlocks;
      const int nb = static_cast<int>(std::min<int64_t>(kMaxBlocks, blocks - block0));
      const int64_t col0 = block0 * kColsPerBlock;
      const int64_t cols = std::min<int64_t>(n - col0, nb * kColsPerBlock);
      for (int64_t r = 0; r < m; r += kMaxRows) {
        const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
        table.fn[mr][nb](xp + r * k, k, wp + block0 * block_stride, block_stride, pairs, yp + r * n + col0, n,
                         bp ? bp + col0 : nullptr, cols);
      }
    }
  });
  return y;
}

TORCH_LIBRARY(sarathi_kernels, lib) {
  lib.def("cpu_supported() -> bool", &cpu_supported);
  lib.def("amx_bf16_ready() -> bool", [] { return cpu_supported() && amx_bf16_ready(); });
  lib.def("bf16_gemm_pack(Tensor weight, Tensor(a!) out) -> ()", &bf16_gemm_pack);
  lib.def("bf16_gemm(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor", &bf16_gemm);
}

}  // namespace sarathi_kernels
