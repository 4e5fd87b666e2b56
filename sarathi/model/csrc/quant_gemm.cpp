// y[M, N] (float32) = x[M, K] (bf16 or float32) @ W[N, K]^T for a weight kept in a GGUF
// quantization (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, Q3_K and Q2_K, the last two with
// sub-blocks of 16), never dequantized in memory.
//
// Every such format stores, per sub-block of 16 or 32 weights of a row, small integer codes q and scales:
//     w = s * (q - z) + m,   s = d (* sc),   m = dm (* mc)
// with d, dm float16 (per block, or per 256-weight super-block for k-quants) and sc, mc small integers (per
// sub-block, k-quants only). The scales are applied once per sub-block:
//     sum_k w x = s * sum_k (q - z) x + m * sum_k x.
// Three paths multiply the codes, the first two over exactly the file's values:
// - a few rows of x (M <= quant_int8_rows(bits): timed on the machine, else 4 to 256 by code width and CPU kind;
//   decode, short prefills): x, as given (float32 or bf16, read in
//   place, quantized into a per-thread buffer), is split into two int8 terms per 32 positions (QuantizedRows: 16 bits of resolution, where one int8 term is too coarse for our contract),
//   and VPDPBUSD sums 4 code x int8 products per lane in int32, twice; one conversion to float32 per
//   sub-block. This reads the weight once at near the memory's speed (codes are never widened past bytes).
//   On a CPU with AVX-512 BW but no AVX512-BF16 (cpu_int8_isa: with VNNI, or without it VPMADDWD on x's two terms
//   joined into one int16) this path takes every row count and the rest of quant_gemm is its AVX2 build
//   (quant_gemm_avx2.cpp).
// - more rows (prefill, batched decode): the codes of a chunk are decoded to bf16 once into a per-thread
//   scratch and reused by every row, multiplied against bf16 x with VDPBF16PS (float32 sums): x rounded to
//   bf16 as in our bf16 GEMM.
// - many rows (long prefills, M >= dequant_rows: 48 for formats with offsets, else 96, or as set for the machine):
//   a chunk's codes are decoded straight into bf16 weights s * (q - z) + m, each rounded once, and multiplied as
//   by our bf16 GEMM, with no work per sub-block (run_dequantized). On a CPU with AMX tiles (Xeon Sapphire Rapids on: amx_tiles.h)
//   from 8 rows, by TDPBF16PS (run_dequantized_amx): 5-7x the products per second at 64-256 rows.
//
// Packed layout, per tile of 16 output columns and per group of 32 input positions, made by
// sarathi/model/quantized.py: eight "quads" of 64 bytes, byte 4c + i of quad r = code of column c at position
// 4r + i (the operand VPDPBUSD multiplies against four broadcast int8 activations).
//   4-bit: 256 bytes; byte b of row r (r < 4) = quad r's code | quad (r + 4)'s code << 4
//   5-bit: those 256 bytes, then a 64-byte plane whose bit r of byte b = bit 4 of quad r's code b
//   2-bit: 128 bytes; byte b of row h (h < 2) = the codes b of quads 4h .. 4h + 3, quad 4h + j's at bits 2j, 2j + 1
//   3-bit: those 128 bytes, then a 64-byte plane whose bit r of byte b = bit 2 of quad r's code b
//   6-bit: 384 bytes; byte b of row r (r < 4) = quad r's code | bits 4-5 of quad (r + 4)'s code << 6; rows 4
//          and 5 = the low nibbles of quads 4 | 5 << 4 and 6 | 7 << 4 (bit planes took twice the instructions)
//   8-bit: the 8 quads, 512 bytes, each code q - z + 128 (unsigned).
//   IQ4 (kIq4Codes): the 4-bit layout of the table indices; a byte shuffle per quad makes the values + 128,
//          after which the int8 path multiplies them as 8-bit codes, and the bf16 paths look the values up.
// Scales: d, dm float16 [tiles, super-blocks, 16]; sc int8 and mc uint8 [tiles, sub-blocks, 16].

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <immintrin.h>

#include "amx_tiles.h"
#include "kernel_ops.h"
#include "parallel_ranges.h"
#include "quant_layout.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cpuid.h>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace sarathi_kernels {
namespace {

constexpr int kPairs = kGroup / 2;
constexpr int kChunkGroups = 8;    // groups decoded at a time per tile into the per-thread scratch (16 KiB)
constexpr int kMaxRows = 4;        // rows of x per register tile (measured on a Zen4 against 6 x 1, 6 x 2, 2 x 4)
constexpr int kMaxTiles = 2;       // tiles of 16 columns per register tile: 4 x 2 x 2 accumulators
constexpr int kVnniMaxRows = 4;    // rows of x per register tile of the int8 (VPDPBUSD) path
// The same without VNNI (VPMADDWD): per tile of the int8 path at 8 / 32 rows of Q4_K, 2 rows per register tile
// took 0.74x / 0.86x the time of 3 (which spilled registers), 1 row 0.87x / 0.93x that of 2 (a Zen5 so run)
constexpr int kWideMaxRows = 2;
// How far ahead of its reads a thread prefetches each stream of codes: `streams` tiles read side by side. Without
// prefetching, one row of Q6_K streamed at 19 GB/s and Q8_0 at 30 GB/s from memory on a Zen5 (in cache:
// 65-180 GB/s, so the loop waited on memory); with it 34-44 GB/s. This Zen5's memory runs in a slower (46-52 GB/s)
// and a faster (77-84 GB/s) state, and the best distance moves with it: one row of Q4_K and Q6_K from memory, 2
// threads, one tile's stream 6 KiB ahead against 2 KiB two tiles side by side (`vnni_tiles_per_step`) took
// 0.87-1.02x the time in the slower state and 0.85-0.94x in the faster one; 4 KiB 0.86-1.01x and 0.90-1.03x,
// 8 KiB 0.90-1.06x and 0.83-0.91x. Two streams, one row of x: 4 KiB ahead each rather than 2 took 1.02-1.06x and
// 0.93-0.97x; where two streams serve 3 to 32 rows of x (decode of several sequences; the tile path's prefill),
// 3 KiB each against 2, slower state: 4 and 8 rows 0.94-0.96x, 3 rows 1.01-1.02x (1B Q4_K_M decode steps of
// 4 and 8 sequences 0.99x and 0.97x, prefill of 16 tokens 0.99x).
constexpr int64_t prefetch_bytes(int streams) { return streams == 1 ? 6144 : 3072; }

// The int8 path prefetches its scales every kScaleStep groups (prefetch_span: the lines of BYTES bytes from p),
// not for every group. With intel_cpu() read once per call rather than at each prefetch, on a Zen5 (family 26
// model 2): one row in L2, one thread, 768 x 2,048, Q4_K / Q4_1 / Q8_0 0.84x / 0.89x / 0.83x the time, Q5_K and
// Q6_K 0.96x; 1B Q4_K_M steps of 4 / 8 / 16 sequences 0.91x / 0.95x / 0.92x, a 16-token prefill 0.91x, one
// sequence 1.00x (bound by the memory), both builds side by side (benchmarks/kernel_ab).
constexpr int64_t kScaleStep = 4;
template <int64_t BYTES>
inline void prefetch_span(const void* p) {
  const char* c = static_cast<const char*>(p);
#pragma GCC unroll 4
  for (int64_t at = 0; at < BYTES; at += 64) _mm_prefetch(c + at, _MM_HINT_T0);
  if constexpr (BYTES % 64 != 0 || BYTES > 64) _mm_prefetch(c + BYTES - 1, _MM_HINT_T0);  // a span across lines
}

// Quad r of a group's codes: 64 unsigned bytes, byte 4c + i = code of column c at position 4r + i (IQ4's:
// the table's value + 128, as 8-bit codes are stored).
template <int BITS>
__attribute__((target("avx512f,avx512bw"))) inline __m512i quad_codes(const uint8_t* codes, int r) {
  if constexpr (BITS == 8) {
    return _mm512_loadu_si512(codes + 64 * r);
  } else if constexpr (BITS == kIq4Codes) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_xor_si128(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values)), _mm_set1_epi8(static_cast<char>(0x80))));
    return _mm512_shuffle_epi8(table, quad_codes<4>(codes, r));
  } else if constexpr (BITS < 4) {
    // a 16-bit shift: the two bits kept in each byte come from that byte (the shift is below 8)
    const __m512i packed = _mm512_loadu_si512(codes + 64 * (r / 4));
    __m512i q = _mm512_and_si512(_mm512_srli_epi16(packed, 2 * (r % 4)), _mm512_set1_epi8(3));
    if constexpr (BITS == 3) {
      const __mmask64 hi = _mm512_test_epi8_mask(_mm512_loadu_si512(codes + 128), _mm512_set1_epi8(static_cast<char>(1 << r)));
      q = _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(4));
    }
    return q;
  } else if constexpr (BITS == 6) {
    const __m512i whole = _mm512_loadu_si512(codes + 64 * (r & 3));
    if (r < 4) return _mm512_and_si512(whole, _mm512_set1_epi8(0x3F));
    const __m512i packed = _mm512_loadu_si512(codes + 256 + 64 * ((r - 4) / 2));
    const __m512i low = _mm512_and_si512(r % 2 ? _mm512_srli_epi16(packed, 4) : packed, _mm512_set1_epi8(0x0F));
    // low | (bits 6-7 of `whole` moved to 4-5); the mask drops what else the 16-bit shift brings
    return _mm512_ternarylogic_epi32(low, _mm512_srli_epi16(whole, 2), _mm512_set1_epi8(0x30), 0xF8);  // a | (b & c)
  } else {
    const __m512i packed = _mm512_loadu_si512(codes + 64 * (r & 3));
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i q = r < 4 ? _mm512_and_si512(packed, nibble) : _mm512_and_si512(_mm512_srli_epi16(packed, 4), nibble);
    if constexpr (BITS == 5) {
      const __mmask64 hi = _mm512_test_epi8_mask(_mm512_loadu_si512(codes + 256), _mm512_set1_epi8(static_cast<char>(1 << r)));
      q = _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(16));
    }
    return q;
  }
}

// Codes of one group -> bf16 values q - z in the pair layout VDPBF16PS wants, into scratch: pair p (positions
// 2p, 2p + 1) is 32 bf16 lanes, lane 2c + j = column c at position 2p + j. Column c's 4 codes of a quad are one
// dword, so one in-lane byte shuffle widens a quad's two pairs each (no cross-lane permutes), then a table
// lookup makes the values.
template <int BITS>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void decode_group(
    const uint8_t* codes, uint16_t* out, const uint16_t* lut) {
  const __m512i lut0 = _mm512_loadu_si512(lut), lut1 = _mm512_loadu_si512(lut + 32);
  // per 4-byte column: bytes (0, 1) -> words (pair 2r), bytes (2, 3) -> words (pair 2r + 1); -1 writes zero
  const __m512i pick0 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13, -1));
  const __m512i pick1 = _mm512_broadcast_i32x4(_mm_setr_epi8(2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1, 14, -1, 15, -1));
  for (int r = 0; r < kQuads; ++r) {
    const __m512i q = quad_codes<BITS == kIq4Codes ? 4 : BITS>(codes, r);  // IQ4: indices into `lut`
    for (int h = 0; h < 2; ++h) {
      const __m512i idx = _mm512_shuffle_epi8(q, h ? pick1 : pick0);  // codes, pair 2r + h
      __m512i w;
      if constexpr (BITS == 8) {
        const __m512i v = _mm512_sub_epi16(idx, _mm512_set1_epi16(128));
        const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(v)));
        const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(v, 1)));
        w = (__m512i)_mm512_cvtne2ps_pbh(f1, f0);
      } else if constexpr (BITS == 6) {
        w = _mm512_permutex2var_epi16(lut0, idx, lut1);
      } else {
        w = _mm512_permutexvar_epi16(idx, lut0);
      }
      _mm512_storeu_si512(out + (2 * r + h) * 32, w);
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

// Store masks of NB 16-column tiles of which `cols` columns are valid.
template <int NB>
inline void column_masks(int64_t cols, __mmask16* mask) {
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) {
    const int64_t left = cols - j * kCols;
    mask[j] = left >= kCols ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
  }
}

// MR rows of x against NB tiles' decoded chunk of `ngroups` groups starting at group g0 (scratch holds tile j's
// groups at j * tile_stride); accumulates into y (columns of tile0 onwards, `cols` of them valid).
template <int MR, int NB, int SUB, bool SC, bool MIN>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_chunk(
    const int32_t* x, int64_t ldx_pairs, const float* xsum, int64_t ldsum, const uint16_t* scratch,
    int64_t tile_stride, int ngroups, int64_t g0, const Weight& w, int64_t tile0, float* y, int64_t ldy, int64_t cols,
    bool first) {
  constexpr int kSubsPerGroup = kGroup / SUB;
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  __mmask16 mask[NB];
  column_masks<NB>(cols, mask);
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
      // Two sets of sums, over even and odd pairs: twice the chains of VDPBF16PS. A Zen5 issues two per cycle
      // at a latency of ~6, so the tile's 8 chains held it to two thirds of that (one thread, in cache, 16
      // rows: Q4_K and Q8_0 0.84x the time of one set, 64 rows 0.81x, Q6_K 0.95x).
      __m512 tmp[2][MR][NB];
#pragma GCC unroll 2
      for (int c = 0; c < 2; ++c)
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) tmp[c][i][j] = _mm512_setzero_ps();
      const int64_t pair0 = (g0 + g) * kPairs + s * (SUB / 2);
      const uint16_t* wrow = scratch + (g * kPairs + s * (SUB / 2)) * 32;
#pragma GCC unroll 16
      for (int p = 0; p < SUB / 2; ++p) {
        const int c = p % 2;
        __m512bh wv[NB];
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(wrow + j * tile_stride + p * 32);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512bh xv = (__m512bh)_mm512_set1_epi32(x[i * ldx_pairs + pair0 + p]);
#pragma GCC unroll 4
          for (int j = 0; j < NB; ++j) tmp[c][i][j] = _mm512_dpbf16_ps(tmp[c][i][j], xv, wv[j]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
        for (int j = 0; j < NB; ++j) tmp[0][i][j] = _mm512_add_ps(tmp[0][i][j], tmp[1][i][j]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) {
        const int64_t tile = tile0 + j;
        const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
        __m512 scale = halves16(w.d + super_at);
        if constexpr (SC) scale = _mm512_mul_ps(scale, bytes16(w.sc + sub_at));
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) acc[i][j] = _mm512_fmadd_ps(tmp[0][i][j], scale, acc[i][j]);
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

// Every (rows, tiles) instantiation of a register-tile kernel, indexed at run time: fn[MR][NB]. `Kernels`
// names the instantiation: `Kernels::at<MR, NB>()`.
template <typename Fn, int MaxRows, typename Kernels>
struct TileTable {
  Fn fn[MaxRows + 1][kMaxTiles + 1] = {};
  template <int MR, int... NBs>
  void put_row(std::integer_sequence<int, NBs...>) {
    ((fn[MR][NBs + 1] = Kernels::template at<MR, NBs + 1>()), ...);
  }
  template <int... MRs>
  void put_all(std::integer_sequence<int, MRs...>) {
    (put_row<MRs + 1>(std::make_integer_sequence<int, kMaxTiles>{}), ...);
  }
  TileTable() { put_all(std::make_integer_sequence<int, MaxRows>{}); }
};

template <int SUB, bool SC, bool MIN>
struct RowsKernels {
  template <int MR, int NB>
  static RowsFn at() {
    return &rows_chunk<MR, NB, SUB, SC, MIN>;
  }
};

// Where a tile's code stream is prefetched while group g is read: prefetch_bytes(step) further on. Past the
// register tile's end (tiles tile0 .. tile0 + step - 1) that is the same place in the next `step` tiles, this
// thread's next register tile (parallel_stealing gives each thread contiguous claims; past a weight's end a
// prefetch is harmless), not the start of the tile after this one (one of the same register tile, read
// already). One row from memory, 2 threads on a Zen5: Q4_K, Q4_1 and Q5_K 0.91-0.92x the time, Q6_K 0.99x; Q8_0
// was 1.03x (not understood), so 8-bit codes keep the plain distance.
template <int BITS>
inline const uint8_t* codes_ahead(const Weight& w, int64_t tile0, int step, int j, int64_t g) {
  constexpr int64_t bytes = group_bytes(BITS);
  const int64_t tile_bytes = w.groups * bytes, at = g * bytes + prefetch_bytes(step);
  const bool next = BITS != 8 && at >= tile_bytes;
  return w.codes + (tile0 + j + (next ? step : 0)) * tile_bytes + (next ? at - tile_bytes : at);
}

// The bf16 values q - z of every 6-bit code q (decode_group's table), or IQ4's table values: exact, the top
// 16 bits of the float.
struct CodeValues {
  uint16_t values[64];
  CodeValues(int bits, int zero) {
    for (int i = 0; i < 64; ++i) {
      const float v = bits == kIq4Codes ? (i < 16 ? kIq4Values[i] : 0.0f) : static_cast<float>(i - zero);
      uint32_t bitsv;
      std::memcpy(&bitsv, &v, 4);
      values[i] = static_cast<uint16_t>(bitsv >> 16);
    }
  }
};

// Groups g0 .. g0 + ng - 1 of tile tile0 + j decoded into `out` (decode_group's layout, group after group), each
// tile's codes prefetched ahead for a thread reading `step` tiles side by side.
template <int BITS>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) inline void decode_chunk(const Weight& w, int64_t tile0, int step, int j, int64_t g0, int ng, uint16_t* out,
                         const uint16_t* lut) {
  constexpr int64_t bytes = group_bytes(BITS);
  const bool intel = intel_cpu();
  for (int g = 0; g < ng; ++g) {
    const uint8_t* codes = w.codes + ((tile0 + j) * w.groups + g0 + g) * bytes;
    prefetch_codes(codes_ahead<BITS>(w, tile0, step, j, g0 + g), bytes, 0, intel);
    decode_group<BITS>(codes, out + g * kPairs * 32, lut);
  }
}

template <int BITS, int SUB, bool SC, bool MIN>
void run(const int32_t* x, int64_t m, int64_t k, const float* xsum, const Weight& w, float* y, int64_t ldy,
         int64_t n) {
  static const TileTable<RowsFn, kMaxRows, RowsKernels<SUB, SC, MIN>> table;
  const CodeValues lut(BITS, w.zero);
  const int64_t tiles = (n + kCols - 1) / kCols, ldx_pairs = k / 2, ldsum = k / SUB;
  const int64_t tile_stride = kChunkGroups * kPairs * 32;
  const int64_t tile_groups = (tiles + kMaxTiles - 1) / kMaxTiles;
  parallel_stealing(tile_groups, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) uint16_t scratch[kMaxTiles * kChunkGroups * kPairs * 32];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t tile0 = q * kMaxTiles;
      const int nb = static_cast<int>(std::min<int64_t>(kMaxTiles, tiles - tile0));
      const int64_t col0 = tile0 * kCols, cols = std::min<int64_t>(n - col0, nb * kCols);
      for (int64_t g0 = 0; g0 < w.groups; g0 += kChunkGroups) {
        const int ng = static_cast<int>(std::min<int64_t>(kChunkGroups, w.groups - g0));
        for (int j = 0; j < nb; ++j)
          decode_chunk<BITS>(w, tile0, kMaxTiles, j, g0, ng, scratch + j * tile_stride, lut.values);
        for (int64_t r = 0; r < m; r += kMaxRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kMaxRows, m - r));
          table.fn[mr][nb](x + r * ldx_pairs, ldx_pairs, MIN ? xsum + r * ldsum : nullptr, ldsum, scratch,
                           tile_stride, ng, g0, w, tile0, y + r * ldy + col0, ldy, cols, g0 == 0);
        }
      }
    }
  });
}

// ---- Many rows of x (long prefills): tiles dequantized to bf16 weights, then a plain bf16 register tile ----
//
// Past kDequantRows rows the per-sub-block work of rows_chunk (two chain sets joined, a scale and an offset
// FMA per accumulator per 16 or 32 positions) outweighs decoding: each chunk of codes is decoded once to the
// bf16 weights w = s * (q - z) + m (rounded once, from float32), and every row of x runs against it with the
// bf16 GEMM's 6 x 4 register tile, nothing per sub-block. The weights multiplied are then the bf16 roundings
// of the file's, as in our bf16 model (`--dtype bfloat16`), where the paths below multiply the file's exact
// values: the "dequantize a tile to bf16 for large batches".
constexpr int kDqRows = 6;   // rows of x per register tile of the dequantized path (as bf16_gemm.cpp's)
constexpr int kDqTiles = 4;  // 16-column tiles per register tile: 6 x 4 accumulators, 4 weights, 1 broadcast
constexpr int kDqChunkGroups = 16;  // at most this many groups decoded at a time per tile (32 KiB)

// Rows from which quant_gemm takes the dequantized-tile path on the AVX-512 build, past the int8 path's rows.
// Measured on a Zen5 against the tile path (2 threads, weights 4,096 x 512, 16,384 x 2,048, 2,048 x 8,192 and
// SmolLM2's, in cache and from memory; `benchmarks/quant_kernel.py`-style single products): formats with offsets
// (Q4_1, Q5_1, Q4_K, Q5_K), whose tile path does two FMAs per accumulator per sub-block, 0.85-1.0x the time
// at 48 rows and 0.86-0.95x at 256; formats without (Q8_0, Q4_0, Q5_0, Q6_K) 1.0-1.19x at 48 and 64 rows, 0.87-1.03x at
// 96, 0.85-1.0x at 128. $SARATHI_DEQUANT_ROWS (read once) sets both, for measurements; set_quant_dequant_rows one.
constexpr int64_t kDequantRowsOffsets = 48;
constexpr int64_t kDequantRowsPlain = 96;
// With AMX tiles (run_dequantized_amx) from half a tile of rows of x. On a 2-core Xeon (family 6 model 167),
// Llama 3.2 1B's MLP weights from memory: 0.48x (Q4_K and Q6_K) the time of rows_chunk at 16 rows, 0.93x and
// 0.83x at 8.
constexpr int64_t kDequantRowsAmx = 8;
int64_t dequant_rows_builtin(bool offsets) {
  if (amx_bf16_ready()) return kDequantRowsAmx;
  return offsets ? kDequantRowsOffsets : kDequantRowsPlain;
}

// Per kind (formats without offsets, with them), the threshold set with set_quant_dequant_rows; -1: the built-in
// one (or $SARATHI_DEQUANT_ROWS's).
std::atomic<int64_t> g_dequant_rows_set[2] = {-1, -1};

int64_t dequant_rows(bool offsets) {
  const int64_t chosen = g_dequant_rows_set[offsets].load(std::memory_order_relaxed);
  if (chosen > 0) return chosen;
  static const int64_t env = [] {
    const char* v = std::getenv("SARATHI_DEQUANT_ROWS");
    return v != nullptr ? std::max<int64_t>(1, std::atoll(v)) : int64_t{-1};
  }();
  return env > 0 ? env : dequant_rows_builtin(offsets);
}

// The bf16 weights w = s * (q - z) (+ m) of `ngroups` groups of tile `tile` from group g0, in decode_group's
// pair layout, straight from the codes (each tile's stream prefetched ahead for a thread reading `step` tiles side
// by side): the integer q - z (the code less its zero, or IQ4's table value) is widened to float32 in registers
// and scaled, each weight rounded to bf16 once. Decoding to bf16 q - z first (decode_chunk) and scaling that in a
// second pass, the same values, took 1.05x the time of a 1B-class Q4_K_M mixed iteration (64-token chunk and 16
// decodes) and of a 64-token prefill (a Zen5, both builds side by side).
template <int BITS, int SUB, bool SC, bool MIN>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void decode_dequantized(
    const Weight& w, int64_t tile, int step, int j, int64_t g0, int ngroups, uint16_t* out) {
  constexpr int kSubsPerGroup = kGroup / SUB;
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  constexpr int64_t bytes = group_bytes(BITS);
  const __m512i dup_lo = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  const __m512i dup_hi = _mm512_add_epi32(dup_lo, _mm512_set1_epi32(8));
  const __m512i pick0 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, -1, 1, -1, 4, -1, 5, -1, 8, -1, 9, -1, 12, -1, 13, -1));
  const __m512i pick1 = _mm512_broadcast_i32x4(_mm_setr_epi8(2, -1, 3, -1, 6, -1, 7, -1, 10, -1, 11, -1, 14, -1, 15, -1));
  const __m512i zero = _mm512_set1_epi16(static_cast<int16_t>(byte_valued(BITS) ? 128 : w.zero));
  const bool intel = intel_cpu();
  for (int g = 0; g < ngroups; ++g) {
    const uint8_t* codes = w.codes + (tile * w.groups + g0 + g) * bytes;
    prefetch_codes(codes_ahead<BITS>(w, tile - j, step, j, g0 + g), bytes, 0, intel);
    uint16_t* pairs = out + g * kPairs * 32;
    for (int s = 0; s < kSubsPerGroup; ++s) {
      const int64_t sub = (g0 + g) * kSubsPerGroup + s, sup = sub / subs_per_super;
      const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
      __m512 scale = halves16(w.d + super_at);
      if constexpr (SC) scale = _mm512_mul_ps(scale, bytes16(w.sc + sub_at));
      __m512 shift = _mm512_setzero_ps();
      if constexpr (MIN) {
        shift = halves16(w.dm + super_at);
        if constexpr (SC) shift = _mm512_mul_ps(shift, bytes16(w.mc + sub_at));
      }
      const __m512 s_lo = _mm512_permutexvar_ps(dup_lo, scale), s_hi = _mm512_permutexvar_ps(dup_hi, scale);
      const __m512 m_lo = _mm512_permutexvar_ps(dup_lo, shift), m_hi = _mm512_permutexvar_ps(dup_hi, shift);
#pragma GCC unroll 4
      for (int r = s * (SUB / 4); r < (s + 1) * (SUB / 4); ++r) {
        const __m512i q = quad_codes<BITS>(codes, r);
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          const __m512i v = _mm512_sub_epi16(_mm512_shuffle_epi8(q, h ? pick1 : pick0), zero);  // q - z, pair 2r + h
          const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(v)));
          const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(v, 1)));
          const __m512 wl = MIN ? _mm512_fmadd_ps(lo, s_lo, m_lo) : _mm512_mul_ps(lo, s_lo);
          const __m512 wh = MIN ? _mm512_fmadd_ps(hi, s_hi, m_hi) : _mm512_mul_ps(hi, s_hi);
          _mm512_storeu_si512(pairs + (2 * r + h) * 32, (__m512i)_mm512_cvtne2ps_pbh(wh, wl));
        }
      }
    }
  }
}

// MR rows of x (bf16 pairs) against NB tiles' dequantized chunk of `npairs` pairs from pair0; y accumulates
// (or, when `first`, is overwritten).
template <int MR, int NB>
__attribute__((target("avx512f,avx512bf16"))) void dequantized_rows(
    const int32_t* x, int64_t ldx_pairs, int64_t pair0, const uint16_t* scratch, int64_t tile_stride, int npairs,
    float* y, int64_t ldy, int64_t cols, bool first) {
  __mmask16 mask[NB];
  column_masks<NB>(cols, mask);
  __m512 acc[MR][NB];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j)
      acc[i][j] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask[j], y + i * ldy + j * kCols);
  const int32_t* rows[MR];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) rows[i] = x + i * ldx_pairs + pair0;
  for (int p = 0; p < npairs; ++p) {
    __m512bh wv[NB];
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) wv[j] = (__m512bh)_mm512_loadu_si512(scratch + j * tile_stride + p * 32);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(rows[i][p]);
#pragma GCC unroll 4
      for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xv, wv[j]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(y + i * ldy + j * kCols, mask[j], acc[i][j]);
}

using DequantizedFn = void (*)(const int32_t*, int64_t, int64_t, const uint16_t*, int64_t, int, float*, int64_t,
                               int64_t, bool);

// fn[MR][NB] of dequantized_rows, MR <= kDqRows, NB <= kDqTiles.
struct DequantizedTable {
  DequantizedFn fn[kDqRows + 1][kDqTiles + 1] = {};
  template <int MR, int... NBs>
  void put_row(std::integer_sequence<int, NBs...>) {
    ((fn[MR][NBs + 1] = &dequantized_rows<MR, NBs + 1>), ...);
  }
  template <int... MRs>
  void put_all(std::integer_sequence<int, MRs...>) {
    (put_row<MRs + 1>(std::make_integer_sequence<int, kDqTiles>{}), ...);
  }
  DequantizedTable() { put_all(std::make_integer_sequence<int, kDqRows>{}); }
};

template <int BITS, int SUB, bool SC, bool MIN>
void run_dequantized(const int32_t* x, int64_t m, int64_t k, const Weight& w, float* y, int64_t ldy, int64_t n) {
  static const DequantizedTable table;
  const int64_t tiles = (n + kCols - 1) / kCols, ldx_pairs = k / 2;
  // chunks of equal size (a short last chunk costs a pass over every row of y for little work)
  const int64_t chunks = (w.groups + kDqChunkGroups - 1) / kDqChunkGroups;
  const int64_t chunk_groups = (w.groups + chunks - 1) / chunks;
  const int64_t tile_stride = chunk_groups * kPairs * 32;
  const int64_t tile_groups = (tiles + kDqTiles - 1) / kDqTiles;
  parallel_stealing(tile_groups, 1, [&](int64_t q0, int64_t q1) {
    alignas(64) uint16_t scratch[kDqTiles * kDqChunkGroups * kPairs * 32];
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t tile0 = q * kDqTiles;
      const int nb = static_cast<int>(std::min<int64_t>(kDqTiles, tiles - tile0));
      const int64_t col0 = tile0 * kCols, cols = std::min<int64_t>(n - col0, nb * kCols);
      for (int64_t g0 = 0; g0 < w.groups; g0 += chunk_groups) {
        const int ng = static_cast<int>(std::min<int64_t>(chunk_groups, w.groups - g0));
        for (int j = 0; j < nb; ++j) {
          decode_dequantized<BITS, SUB, SC, MIN>(w, tile0 + j, kDqTiles, j, g0, ng, scratch + j * tile_stride);
        }
        for (int64_t r = 0; r < m; r += kDqRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kDqRows, m - r));
          table.fn[mr][nb](x + r * ldx_pairs, ldx_pairs, g0 * kPairs, scratch, tile_stride, ng * kPairs,
                           y + r * ldy + col0, ldy, cols, g0 == 0);
        }
      }
    }
  });
}

// The same on AMX tiles (amx_tiles.h): the dequantized chunk is already the tiles' weight operand, and 32 rows
// of x x 32 columns take 4 TDPBF16PS per group where the register tile above takes 256 VDPBF16PS. x is bf16,
// padded to a multiple of 16 rows. A chunk spans up to kAmxChunkGroups groups (2,048 positions: a whole row
// of most weights, so each result tile is written once), 4 tiles of it 256 KiB of scratch, in L2.
constexpr int kAmxTiles = 4;
constexpr int kAmxChunkGroups = 64;

template <int BITS, int SUB, bool SC, bool MIN>
void run_dequantized_amx(const uint16_t* x, int64_t m, int64_t k, const Weight& w, float* y, int64_t ldy, int64_t n) {
  const int64_t tiles = (n + kCols - 1) / kCols;
  const int64_t chunks = (w.groups + kAmxChunkGroups - 1) / kAmxChunkGroups;
  const int64_t chunk_groups = (w.groups + chunks - 1) / chunks;
  const int64_t tile_stride = chunk_groups * kPairs * 32;
  const int64_t tile_groups = (tiles + kAmxTiles - 1) / kAmxTiles;
  parallel_stealing(tile_groups, 1, [&](int64_t q0, int64_t q1) {
    static thread_local std::vector<uint16_t> buffer;
    buffer.resize(std::max<size_t>(buffer.size(), kAmxTiles * tile_stride));
    uint16_t* scratch = buffer.data();
    amx_begin();
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t tile0 = q * kAmxTiles;
      const int nb = static_cast<int>(std::min<int64_t>(kAmxTiles, tiles - tile0));
      const int64_t col0 = tile0 * kCols, cols = std::min<int64_t>(n - col0, nb * kCols);
      for (int64_t g0 = 0; g0 < w.groups; g0 += chunk_groups) {
        const int ng = static_cast<int>(std::min<int64_t>(chunk_groups, w.groups - g0));
        for (int j = 0; j < nb; ++j) {
          decode_dequantized<BITS, SUB, SC, MIN>(w, tile0 + j, kAmxTiles, j, g0, ng, scratch + j * tile_stride);
        }
        amx_rows(x + g0 * kGroup, k, m, scratch, tile_stride, nb, ng, y + col0, ldy, cols, g0 == 0);
      }
    }
    amx_end();
  });
}

// x rows for the VNNI path: QuantizedRows (quant_layout.h).

// 16 values of a row of x (float32 or bf16) as float32.
__attribute__((target("avx512f"))) inline __m512 load_x16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f,avx512bw"))) inline __m512 load_x16(const at::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

template <typename T>
__attribute__((target("avx512f,avx512bw"))) void quantize_row(const T* x, int64_t k, int sub, int8_t* q1, int8_t* q2,
                                                               float* dx, int32_t* isum, float* xsum) {
  const __m512 fine = _mm512_set1_ps(static_cast<float>(kFine));
  for (int64_t b = 0; b < k / kGroup; ++b) {
    const __m512 x0 = load_x16(x + b * kGroup), x1 = load_x16(x + b * kGroup + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    dx[b] = amax / (127.0f * kFine);
    __m512i sums[2];
    for (int h = 0; h < 2; ++h) {
      const __m512 t = _mm512_mul_ps(h ? x1 : x0, inv);
      const __m512i c = _mm512_cvtps_epi32(t);  // round to nearest even
      __m512i f = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(t, _mm512_cvtepi32_ps(c)), fine));
      f = _mm512_min_epi32(_mm512_max_epi32(f, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q1 + b * kGroup + 16 * h), _mm512_cvtsepi32_epi8(c));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + b * kGroup + 16 * h), _mm512_cvtsepi32_epi8(f));
      sums[h] = _mm512_add_epi32(_mm512_slli_epi32(c, kFineShift), f);
    }
    if (sub == kGroup) {
      isum[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(sums[0], sums[1]));
      xsum[b] = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
    } else {  // 16
      isum[2 * b] = _mm512_reduce_add_epi32(sums[0]), isum[2 * b + 1] = _mm512_reduce_add_epi32(sums[1]);
      xsum[2 * b] = _mm512_reduce_add_ps(x0), xsum[2 * b + 1] = _mm512_reduce_add_ps(x1);
    }
  }
}

// The few rows of x the VNNI path multiplies, quantized into a per-thread buffer reused across calls (a decode
// step makes ~100 calls: allocations would cost more than quantizing).
template <typename T>
QuantizedRows quantize_rows(const T* x, int64_t ldx, int64_t m, int64_t k, int64_t sub) {
  static thread_local std::vector<int64_t> buffer;  // int64_t: 8-byte aligned parts
  const int64_t nsub = k / sub, blocks = k / kGroup;
  const int64_t codes = (2 * m * k + 7) / 8, floats = (m * (blocks + 2 * nsub) + 1) / 2;
  buffer.resize(static_cast<size_t>(codes + floats));
  int8_t* q = reinterpret_cast<int8_t*>(buffer.data());
  float* dx = reinterpret_cast<float*>(buffer.data() + codes);
  float* xsum = dx + m * blocks;
  int32_t* isum = reinterpret_cast<int32_t*>(xsum + m * nsub);
  for (int64_t i = 0; i < m; ++i)
    quantize_row(x + i * ldx, k, static_cast<int>(sub), q + i * k, q + (m + i) * k, dx + i * blocks, isum + i * nsub,
                 xsum + i * nsub);
  return {q, q + m * k, dx, isum, xsum, k, sub};
}

// VPDPBUSD is written as assembly so that the compiler is never allowed AVX-512 VNNI itself: the same kernels run
// on AVX-512 CPUs without it (vnni_tiles' DP false), and there no VNNI instruction may appear.
// acc + VPDPBUSD(u, xb): per int32 lane, the 4 products of unsigned codes and int8 values of x.
__attribute__((target("avx512f"))) inline __m512i dpbusd(__m512i acc, __m512i u, __m512i xb) {
  asm("vpdpbusd %[x], %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [x] "v"(xb));
  return acc;
}

// acc + VPDPBUSD(u, the 4 int8 values at x broadcast to every lane).
__attribute__((target("avx512f"))) inline __m512i dpbusd_broadcast(__m512i acc, __m512i u, const int8_t* x) {
  asm("vpdpbusd %[x]%{1to16%}, %[u], %[acc]" : [acc] "+v"(acc) : [u] "v"(u), [x] "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// x's two int8 terms joined, 256 * q1 + q2 (|.| <= 32,639), as int16 rows [m, k] (a per-thread buffer reused
// across calls): what the int8 path multiplies on AVX-512 without VNNI.
__attribute__((target("avx512f,avx512bw"))) const int16_t* joined_terms(const QuantizedRows& x, int64_t m) {
  static thread_local std::vector<int16_t> buffer;
  buffer.resize(static_cast<size_t>(m * x.k));
  for (int64_t j = 0; j < m * x.k; j += 32) {  // k is a multiple of 32
    const __m512i q1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q1 + j)));
    const __m512i q2 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q2 + j)));
    _mm512_storeu_si512(buffer.data() + j, _mm512_add_epi16(_mm512_slli_epi16(q1, kFineShift), q2));
  }
  return buffer.data();
}

// One quad of NB tiles' codes widened to int16 (lo, hi: the two halves of each tile's columns) times MR rows of
// x16 (256 * q1 + q2; a row every ldx values), VPMADDWD's int32 pair sums added to lo_sum and hi_sum.
template <int MR, int NB>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void wide_quad(__m512i (&lo_sum)[MR][NB],
                                                                                 __m512i (&hi_sum)[MR][NB],
                                                                                 const __m512i (&lo)[NB],
                                                                                 const __m512i (&hi)[NB],
                                                                                 const int16_t* x16, int64_t ldx) {
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i) {
    // x's 4 values broadcast from memory (a load, not a shuffle)
    const __m512i xq = _mm512_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x16 + i * ldx)));
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      lo_sum[i][j] = _mm512_add_epi32(lo_sum[i][j], _mm512_madd_epi16(lo[j], xq));
      hi_sum[i][j] = _mm512_add_epi32(hi_sum[i][j], _mm512_madd_epi16(hi[j], xq));
    }
  }
}

// MR quantized rows of x against NB tiles, the whole depth: VPDPBUSD over the codes read in place (DP), or on
// AVX-512 without VNNI (Intel Skylake-SP) VPMADDWD: the codes of a quad widened to int16 once for all rows, times
// x's two terms joined into one int16 (x.x16), int32 pair sums that add up over a sub-block without overflow (16
// products of a code <= 255 and |x| <= 32,639 per lane). The same integers either way, so the same outputs. Per
// row and quad that is two VPMADDWD and two adds where VPDPBUSD takes two instructions: on a Zen5 run so
// (SARATHI_KERNELS=avx512bw) Q4_K at 8 / 32 rows took 1.8x / 1.9x the VNNI kernel's time. VPMADDUBSW on each
// int8 term, widened by VPMADDWD at once (8-bit codes would overflow its int16 pairs over two quads), took
// 1.25x / 1.35x this kernel's time.
template <bool DP, int BITS, int MR, int NB, int SUB, bool SC, bool MIN>
__attribute__((target("avx512f,avx512bw"))) void vnni_tiles(const QuantizedRows& x, const Weight& w,
                                                                        int64_t tile0, float* y, int64_t ldy,
                                                                        int64_t cols) {
  constexpr int kSubsPerGroup = kGroup / SUB, kQuadsPerSub = SUB / 4;
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  constexpr int64_t bytes = group_bytes(BITS);
  const int64_t ldb = x.k / kGroup;
  const int32_t zero = byte_valued(BITS) ? 128 : w.zero;
  __mmask16 mask[NB];
  column_masks<NB>(cols, mask);
  __m512 acc[MR][NB];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) acc[i][j] = _mm512_setzero_ps();
  constexpr int64_t kAheadGroups = prefetch_bytes(NB) / bytes;
  // k-quants' super-block scales d and dm, converted once per super-block rather than once per sub-block: at
  // one or two rows (one thread in cache: Q4_K 0.95x / 0.90x the time at 1 / 2 rows, Q6_K 0.92x at one row;
  // 3 rows gained nothing, 4 leave no registers for them)
  constexpr bool kHoist = SC && MR <= 2;
  constexpr int64_t groups_per_super = subs_per_super / kSubsPerGroup;
  __m512 d_super[NB], dm_super[NB];
  const bool intel = intel_cpu();
  for (int64_t g = 0; g < w.groups; ++g) {
    if constexpr (kHoist) {
      if (g % groups_per_super == 0)
#pragma GCC unroll 2
        for (int j = 0; j < NB; ++j) {
          const int64_t super_at = ((tile0 + j) * w.supers + g / groups_per_super) * kCols;
          d_super[j] = halves16(w.d + super_at);
          if constexpr (MIN) dm_super[j] = halves16(w.dm + super_at);
        }
    }
    // The codes and scales prefetch_bytes(NB) of codes ahead, past these tiles' end those of the next NB tiles
    // (codes_ahead)
    const int64_t ahead_group = g + kAheadGroups;
    const bool past_end = BITS != 8 && ahead_group >= w.groups;
    // The scales of kScaleStep groups from that one, every kScaleStep groups (Q4_K's 4 scale streams: ~10% faster
    // one row; one prefetch per stream and group was a quarter of the loop's instructions, and most of them asked
    // for the line the one before had)
    if (g % kScaleStep == 0) {
      const int64_t sub = (past_end ? ahead_group - w.groups : ahead_group) * kSubsPerGroup;
      const int64_t sup = sub / subs_per_super, ahead_tile0 = past_end ? tile0 + NB : tile0;
      constexpr int64_t kSupersPerStep = (kScaleStep + groups_per_super - 1) / groups_per_super;
      constexpr int64_t kSuperBytes = kSupersPerStep * kCols * 2, kSubBytes = kScaleStep * kSubsPerGroup * kCols;
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        const int64_t tile = ahead_tile0 + j;
        prefetch_span<kSuperBytes>(w.d + (tile * w.supers + sup) * kCols);
        if constexpr (MIN) prefetch_span<kSuperBytes>(w.dm + (tile * w.supers + sup) * kCols);
        if constexpr (SC) {
          prefetch_span<kSubBytes>(w.sc + (tile * w.subs + sub) * kCols);
          if constexpr (MIN) prefetch_span<kSubBytes>(w.mc + (tile * w.subs + sub) * kCols);
        }
      }
    }
    const uint8_t* codes[NB];
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) {
      codes[j] = w.codes + ((tile0 + j) * w.groups + g) * bytes;
      prefetch_codes(codes_ahead<BITS>(w, tile0, NB, j, g), bytes, 0, intel);
    }
#pragma GCC unroll 2
    for (int s = 0; s < kSubsPerGroup; ++s) {
      // One row: two chains of sums per accumulator (even and odd quads), so VPDPBUSD's latency overlaps;
      // more rows have chains enough (and no registers to spare).
      constexpr int CH = DP && MR == 1 ? 2 : 1;
      // 4-bit codes, one row: the two chains are a sub-block's low nibbles (quads 0-3) and its high ones, taken
      // as 16 x the code (one AND, no shift: 4 instructions a group fewer; the product stays within int32)
      constexpr bool kHighTimes16 = BITS == 4 && CH == 2 && kQuadsPerSub == 8;
      __m512i dot[CH][MR][NB], fine[CH][MR][NB];
#pragma GCC unroll 2
      for (int c = 0; c < CH; ++c)
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) dot[c][i][j] = fine[c][i][j] = _mm512_setzero_si512();
      const int64_t sub = g * kSubsPerGroup + s, sup = sub / subs_per_super, ldsub = x.k / SUB;
      if (DP && zero != 0)  // the zero point's term, - zero * sum(x), starts the second term's sums
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i start = _mm512_set1_epi32(-zero * x.isum[i * ldsub + sub]);
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) fine[0][i][j] = start;
        }
      if constexpr (!DP) {
        // dot and fine: per 128-bit lane L, dwords (column 4L, positions 0-1 / 2-3), (4L + 1, same) of each quad;
        // fine the same for columns 4L + 2, 4L + 3 (the codes' bytes widened in lane: no cross-lane shuffles)
        const __m512i none = _mm512_setzero_si512();
        const int16_t* x16 = x.x16 + g * kGroup;
        if constexpr (BITS == 4 && SUB == kGroup) {
          // each 64 bytes hold quad r's codes (low nibbles) and quad r + 4's: widened once, the words give both
          // (with sub-blocks of 16, Q2_K's and Q3_K's, the two quads are in different sub-blocks: one at a time)
#pragma GCC unroll 4
          for (int r = 0; r < 4; ++r) {
            __m512i lo[NB], hi[NB], lo4[NB], hi4[NB];
#pragma GCC unroll 2
            for (int j = 0; j < NB; ++j) {
              const __m512i packed = _mm512_loadu_si512(codes[j] + 64 * r), nibble = _mm512_set1_epi16(0x0F);
              const __m512i wl = _mm512_unpacklo_epi8(packed, none), wh = _mm512_unpackhi_epi8(packed, none);
              lo[j] = _mm512_and_si512(wl, nibble), hi[j] = _mm512_and_si512(wh, nibble);
              lo4[j] = _mm512_srli_epi16(wl, 4), hi4[j] = _mm512_srli_epi16(wh, 4);
            }
            wide_quad<MR, NB>(dot[0], fine[0], lo, hi, x16 + 4 * r, x.k);
            wide_quad<MR, NB>(dot[0], fine[0], lo4, hi4, x16 + 4 * (r + 4), x.k);
          }
        } else {
#pragma GCC unroll 8
          for (int t = 0; t < kQuadsPerSub; ++t) {
            const int r = s * kQuadsPerSub + t;
            __m512i lo[NB], hi[NB];
#pragma GCC unroll 2
            for (int j = 0; j < NB; ++j) {
              const __m512i q = quad_codes<BITS>(codes[j], r);
              lo[j] = _mm512_unpacklo_epi8(q, none), hi[j] = _mm512_unpackhi_epi8(q, none);
            }
            wide_quad<MR, NB>(dot[0], fine[0], lo, hi, x16 + 4 * r, x.k);
          }
        }
        const __m512i first = _mm512_setr_epi32(0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30);
        const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(1));
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i start = _mm512_set1_epi32(-zero * x.isum[i * ldsub + sub]);
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) {  // the columns' sums, in order, as the second term's (the first's: 0)
            const __m512i sums = _mm512_add_epi32(_mm512_permutex2var_epi32(dot[0][i][j], first, fine[0][i][j]),
                                                  _mm512_permutex2var_epi32(dot[0][i][j], second, fine[0][i][j]));
            fine[0][i][j] = _mm512_add_epi32(sums, start);
            dot[0][i][j] = _mm512_setzero_si512();
          }
        }
      } else {
#pragma GCC unroll 8
        for (int t = 0; t < kQuadsPerSub; ++t) {
          const int r = s * kQuadsPerSub + t, c = kHighTimes16 ? r / 4 : t % CH;
          __m512i u[NB];
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j)
            u[j] = kHighTimes16 && r >= 4
                       ? _mm512_and_si512(_mm512_loadu_si512(codes[j] + 64 * (r - 4)), _mm512_set1_epi8(static_cast<char>(0xF0)))
                       : quad_codes<BITS>(codes[j], r);
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            const int8_t* four1 = x.q1 + i * x.k + g * kGroup + 4 * r;
            const int8_t* four2 = x.q2 + i * x.k + g * kGroup + 4 * r;
            if constexpr (NB == 1) {
              // x's four int8 values broadcast from memory inside the VPDPBUSD (GCC does not fold set1 there):
              // one instruction rather than two
              dot[c][i][0] = dpbusd_broadcast(dot[c][i][0], u[0], four1);
              fine[c][i][0] = dpbusd_broadcast(fine[c][i][0], u[0], four2);
            } else {
              int32_t b1, b2;
              std::memcpy(&b1, four1, 4);
              std::memcpy(&b2, four2, 4);
              const __m512i xb1 = _mm512_set1_epi32(b1), xb2 = _mm512_set1_epi32(b2);
#pragma GCC unroll 2
              for (int j = 0; j < NB; ++j) {
                dot[c][i][j] = dpbusd(dot[c][i][j], u[j], xb1);
                fine[c][i][j] = dpbusd(fine[c][i][j], u[j], xb2);
              }
            }
          }
        }
        if constexpr (kHighTimes16) {  // the high nibbles' sums are 16 times theirs, exactly
#pragma GCC unroll 2
          for (int j = 0; j < NB; ++j) {
            dot[0][0][j] = _mm512_add_epi32(dot[0][0][j], _mm512_srai_epi32(dot[1][0][j], 4));
            fine[0][0][j] = _mm512_add_epi32(fine[0][0][j], _mm512_srai_epi32(fine[1][0][j], 4));
          }
        } else if constexpr (CH == 2) {
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
            for (int j = 0; j < NB; ++j) {
              dot[0][i][j] = _mm512_add_epi32(dot[0][i][j], dot[1][i][j]);
              fine[0][i][j] = _mm512_add_epi32(fine[0][i][j], fine[1][i][j]);
            }
        }
      }
#pragma GCC unroll 2
      for (int j = 0; j < NB; ++j) {
        const int64_t tile = tile0 + j;
        const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
        __m512 scale = kHoist ? d_super[j] : halves16(w.d + super_at);
        if constexpr (SC) scale = _mm512_mul_ps(scale, bytes16(w.sc + sub_at));
        __m512 shift = _mm512_setzero_ps();
        if constexpr (MIN) {
          shift = kHoist ? dm_super[j] : halves16(w.dm + super_at);
          if constexpr (SC) shift = _mm512_mul_ps(shift, bytes16(w.mc + sub_at));
        }
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          const __m512i d = _mm512_add_epi32(_mm512_slli_epi32(dot[0][i][j], kFineShift), fine[0][i][j]);
          const __m512 sx = _mm512_mul_ps(scale, _mm512_set1_ps(x.dx[i * ldb + g]));
          acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sx, acc[i][j]);
          if constexpr (MIN) acc[i][j] = _mm512_fmadd_ps(shift, _mm512_set1_ps(x.xsum[i * ldsub + sub]), acc[i][j]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(y + i * ldy + j * kCols, mask[j], acc[i][j]);
}

using VnniFn = void (*)(const QuantizedRows&, const Weight&, int64_t, float*, int64_t, int64_t);

template <bool DP, int BITS, int SUB, bool SC, bool MIN>
struct VnniKernels {
  template <int MR, int NB>
  static VnniFn at() {
    return &vnni_tiles<DP, BITS, MR, NB, SUB, SC, MIN>;
  }
};

// Tiles per register tile of the int8 path. Two share each broadcast of x (less work per byte) but make a
// thread read two streams of codes that break off at every tile's end; one tile at a time reads one unbroken
// stream. For one row of x that is the faster (prefetch_bytes has the measurements); for 2 rows, one tile 6 KiB
// ahead took 0.86-0.91x the time of two 2 KiB ahead (Q4_K, 16,384 x 2,048 and 2,048 x 8,192, both memory states;
// a 1B Q4_K_M decode step of 2 sequences 0.86x); for 4 rows, one tile 2 KiB ahead took 1.32x. That is AMD's
// balance. On Intel (a 2-core Xeon, family 6 model 167, whose codes are prefetched to L2: prefetch_codes) two
// tiles 3 KiB ahead each are the faster at every row count: 1B Q4_K_M decode steps of 1 / 2 sequences took
// 0.92x / 0.83x the time of one tile 6 KiB ahead (benchmarks/kernel_ab, 12 alternated reps); 12 KiB ahead for
// one tile took 1.01x, 6 KiB each for two 1.04x. On a Zen5 (family 26 model 2) Intel's balance loses: two tiles
// at 1 / 2 rows took 1.14x / 1.11x the time of one, and with the T1 hint too 1.22x / 1.13x (same benchmark).
int64_t vnni_tiles_per_step(int64_t m) { return m <= 2 && !intel_cpu() ? 1 : kMaxTiles; }

template <bool DP, int BITS, int SUB, bool SC, bool MIN>
void run_vnni(const QuantizedRows& x, int64_t m, const Weight& w, float* y, int64_t ldy, int64_t n) {
  constexpr int kMaxR = DP ? kVnniMaxRows : kWideMaxRows;
  static const TileTable<VnniFn, kMaxR, VnniKernels<DP, BITS, SUB, SC, MIN>> table;
  const int64_t tiles = (n + kCols - 1) / kCols, step = vnni_tiles_per_step(m);
  const int64_t tile_groups = (tiles + step - 1) / step;
  // a claim of ~64 KiB of codes: a compare-and-swap per claim is nothing beside it, and the threads end
  // within one claim's time of each other
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / (step * w.groups * group_bytes(BITS)));
  parallel_stealing(tile_groups, grain, [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t tile0 = q * step;
      const int nb = static_cast<int>(std::min<int64_t>(step, tiles - tile0));
      const int64_t col0 = tile0 * kCols, cols = std::min<int64_t>(n - col0, nb * kCols);
      for (int64_t r = 0; r < m; r += kMaxR) {  // the tiles' codes stay in L2 across row tiles
        const int mr = static_cast<int>(std::min<int64_t>(kMaxR, m - r));
        table.fn[mr][nb](x.rows_from(r), w, tile0, y + r * ldy + col0, ldy, cols);
      }
    }
  });
}

// The CPU kinds whose int8 / bf16 path balance was measured apart (below).
enum class CpuKind { kOther, kAmdZen5OrLater, kIntel };

CpuKind cpu_kind() {
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return CpuKind::kOther;
  if (ebx == 0x756e6547) return CpuKind::kIntel;  // "Genu"ineIntel
  if (ebx != 0x68747541) return CpuKind::kOther;  // "Auth"enticAMD
  __get_cpuid(1, &eax, &ebx, &ecx, &edx);
  const unsigned base = (eax >> 8) & 0xF, family = base == 0xF ? base + ((eax >> 20) & 0xFF) : base;
  return family >= 0x1A ? CpuKind::kAmdZen5OrLater : CpuKind::kOther;  // 0x1A: Zen5, full-width 512-bit units
}

// Rows of x up to which the int8 (VPDPBUSD) path runs, by code width and CPU kind, where the machine's own
// timing (set_quant_int8_rows) is not set; more rows take the bf16 path. Both paths timed on the same weights (8,192 x 2,048 and its transpose, from memory, 2 threads;
// `benchmarks/quant_kernel.py --both-paths`):
// - AMD Zen4 (and other CPUs): 8-bit codes, read without decoding, up to 32; other widths 4 (the bf16 path
//   was the faster above 4 rows).
// - AMD Zen5: 4- and 8-bit 32, 5- and 6-bit 16 (`--thresholds`, every format of a width no slower on the
//   int8 path: 0.76-0.99x the bf16 path's time at 8-16 rows, 0.94-1.00x at 32 for 4- and 8-bit codes;
//   1.03-1.30x from 64 rows since the bf16 path's sums run in 16 chains, 1.04-1.29x from 32 for 5- and
//   6-bit codes). 2- and 3-bit codes and IQ4's indices 8: their int8 path decodes more per byte (Q3_K's high
//   bits, Q2_K's 2-bit fields, IQ4's table), 0.82-1.03x the bf16 path's time at 8 rows and 0.94-1.32x at 16,
//   where 4-bit codes took 0.86-0.98x (two `quant_path_tuning --again` runs, a Zen5 family 26 model 2).
// - Intel with AVX512-BF16 (measured on an Emerald Rapids, family 6 model 207): every width up to 256 rows,
//   the most measured (0.41-0.78x the bf16 path's time at 5-256 rows, 6-bit codes included).
int64_t vnni_up_to_rows(int64_t bits) {
  static const CpuKind kind = cpu_kind();
  if (kind == CpuKind::kAmdZen5OrLater) return bits < 4 || bits == kIq4Codes ? 8 : bits == 5 || bits == 6 ? 16 : 32;
  if (bits == kIq4Codes) bits = 4;  // decoded as 4-bit codes on both paths, and timed as such elsewhere
  // With AMX tiles from kDequantRowsAmx rows: on a 2-core Xeon (family 6 model 167, AMX-BF16) the int8 path
  // took 0.49-0.65x the time of the AMX one at 8 rows, at 16 0.82-0.92x for 4- and 8-bit codes and 0.96-1.13x
  // for 5- and 6-bit ones, at 32 1.25-1.86x (`python -m sarathi.model.quant_path_tuning`).
  // 2- and 3-bit codes (Q2_K's, Q3_K's) as 4-bit ones, measured as such before they had layouts of their own
  if (amx_bf16_ready()) return bits <= 4 || bits == 8 ? 16 : 8;
  if (kind == CpuKind::kIntel) return 256;
  return bits == 8 ? 32 : 4;
}

const uint16_t* half_ptr(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::Half>()); }

// Rows up to which the int8 path runs where AVX-512 VNNI runs but AVX512-BF16 does not: every row count, for
// there the other path is the AVX2 one (float32 x against dequantized codes, 8-lane FMAs). On a Zen5 run as
// such a CPU (SARATHI_KERNELS=vnni) the int8 path took 0.30-0.39x that path's time at 64-512 rows, 6-bit codes
// 0.47-0.58x (8,192 x 2,048 and its transpose, from memory, 2 threads).
constexpr int64_t kEveryRow = std::numeric_limits<int64_t>::max();
// The int8 path takes x in slabs of this many rows: every tile of the weight passes over a slab's int8 terms
// while they are in cache (at 2,048 rows x 8,192 features they are 32 MiB), and the buffer stays bounded.
constexpr int64_t kInt8SlabRows = 256;

}  // namespace

// How quant_gemm's int8 path multiplies where AVX512-BF16 does not run (everything else there runs its AVX2 build):
// "vnni" on AVX-512 VNNI (Intel Cascade Lake, Ice Lake), "avx512bw" on AVX-512 BW without VNNI (Intel Skylake-SP),
// "avx2" on the AVX2 build; "" where AVX512-BF16 runs (cpu_supported()). SARATHI_KERNELS=vnni, avx512bw or avx2
// runs a CPU with those instructions so.
std::string cpu_int8_isa() {
  if (cpu_supported()) return "";
  const char* choice = std::getenv("SARATHI_KERNELS");
  const std::string chosen = choice == nullptr ? "" : choice;
  __builtin_cpu_init();
  if (chosen == "avx2" || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw")) return "avx2";
  return chosen != "avx512bw" && __builtin_cpu_supports("avx512vnni") ? "vnni" : "avx512bw";
}

namespace {

enum class Int8Isa { kAvx2, kAvx512Bw, kVnni };

// cpu_int8_isa() (kVnni where AVX512-BF16 runs), asked once: quant_gemm asks on every product.
Int8Isa int8_isa() {
  static const Int8Isa isa = [] {
    const std::string name = cpu_int8_isa();
    return name.empty() || name == "vnni" ? Int8Isa::kVnni : name == "avx512bw" ? Int8Isa::kAvx512Bw : Int8Isa::kAvx2;
  }();
  return isa;
}

}  // namespace

namespace {

// Per code kind (4, 5, 6, 8 bits, IQ4's indices, 2 and 3 bits), the threshold set with set_quant_int8_rows; -1:
// the built-in one.
std::atomic<int64_t> g_int8_rows_set[7] = {-1, -1, -1, -1, -1, -1, -1};

int width_index(int64_t bits, const char* op) {
  TORCH_CHECK(known_code_kind(bits), op, ": unsupported code width ", bits);
  return bits == kIq4Codes ? 4 : bits == 8 ? 3 : bits < 4 ? static_cast<int>(bits) + 3 : static_cast<int>(bits) - 4;
}

}  // namespace

// The threshold the kernel carries for this CPU kind (the tables above), for codes of `bits` bits. IQ4's indices
// take the 4-bit codes' on the AVX-512 build (a Zen5 excepted: vnni_up_to_rows), where both paths decode them as
// 4-bit codes (a byte shuffle more on the int8 path), and the 8-bit codes' on the AVX2 build, whose int8 path
// multiplies them as 8-bit codes (int8_up_to_rows_avx2).
int64_t quant_int8_rows_builtin(int64_t bits) {
  width_index(bits, "quant_int8_rows_builtin");
  // asked once: quant_gemm calls this on every product
  static const bool avx512 = cpu_supported();
  if (avx512) return vnni_up_to_rows(bits);
  return int8_isa() != Int8Isa::kAvx2 ? kEveryRow : int8_up_to_rows_avx2(bits);
}

// Rows of x up to which quant_gemm multiplies x in two int8 terms in this process (more rows: bf16 x on the
// AVX-512 path, float32 x on the AVX2 path), for codes of `bits` bits: the value set for this machine
// (sarathi/model/quant_path_tuning.py times both paths), else the built-in one.
int64_t quant_int8_rows(int64_t bits) {
  const int64_t set = g_int8_rows_set[width_index(bits, "quant_int8_rows")].load(std::memory_order_relaxed);
  return set >= 0 ? set : quant_int8_rows_builtin(bits);
}

// Sets quant_int8_rows(bits) for this process; -1 restores the built-in threshold.
void set_quant_int8_rows(int64_t bits, int64_t rows) {
  TORCH_CHECK(rows >= -1, "set_quant_int8_rows: rows must be -1 (the built-in threshold) or a row count");
  g_int8_rows_set[width_index(bits, "set_quant_int8_rows")].store(rows, std::memory_order_relaxed);
}

// x [M, K] bf16 or float32; codes uint8 [tiles, K/32, bytes]; d, dm float16 [tiles, supers, 16] (dm empty
// without offsets); sc int8, mc uint8 [tiles, K/sub, 16] (empty for non-k-quants); out float32 [M, N] (rows
// may be strided: a column slice of a wider output) is overwritten with x @ W^T.
void quant_gemm(const at::Tensor& x_in, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                const at::Tensor& dm, const at::Tensor& mc, int64_t bits, int64_t sub, int64_t zero, at::Tensor& out,
                int64_t int8_rows) {
  TORCH_CHECK(x_in.dim() == 2, "quant_gemm: x must be 2-D");
  TORCH_CHECK(out.dim() == 2 && out.scalar_type() == at::kFloat && out.stride(1) == 1 && out.size(0) == x_in.size(0),
              "quant_gemm: out must be float32 [M, N] with unit column stride");
  TORCH_CHECK(codes.dim() == 3 && codes.scalar_type() == at::kByte && codes.is_contiguous(), "quant_gemm: bad codes");
  TORCH_CHECK(known_code_kind(bits), "quant_gemm: unsupported code width ", bits);
  TORCH_CHECK(codes.size(2) == group_bytes(static_cast<int>(bits)), "quant_gemm: codes do not match ", bits, " bits");
  const int64_t m = x_in.size(0), k = x_in.size(1), n = out.size(1);
  TORCH_CHECK(k == codes.size(1) * kGroup, "quant_gemm: x has ", k, " features, the weight ", codes.size(1) * kGroup);
  TORCH_CHECK(codes.size(0) == (n + kCols - 1) / kCols, "quant_gemm: out has ", n, " columns, the weight ",
              codes.size(0), " tiles");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.dim() == 3 && d.size(0) == codes.size(0),
              "quant_gemm: bad d");
  const bool has_sc = sc.numel() > 0, has_min = dm.numel() > 0;
  Weight w{codes.data_ptr<uint8_t>(), half_ptr(d), nullptr, nullptr, nullptr, codes.size(1), k / sub, d.size(1),
           static_cast<int>(bits), static_cast<int>(zero)};
  TORCH_CHECK(sub == 16 || sub == 32, "quant_gemm: sub-block size must be 16 or 32");
  TORCH_CHECK(w.supers > 0 && w.subs == w.supers * (has_sc ? 256 / sub : 1),
              "quant_gemm: d must have one scale per sub-block, or per 256 weights with sub-block scales");
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
  float* yp = out.data_ptr<float>();
  const int64_t ldy = out.stride(0);
  const int key = static_cast<int>(bits) * 1000 + static_cast<int>(sub) * 10 + (has_sc ? 2 : 0) + (has_min ? 1 : 0);
  static const bool avx512 = cpu_supported();
  const Int8Isa isa = int8_isa();
  TORCH_CHECK(int8_rows >= -1, "quant_gemm: int8_rows must be -1 (this CPU's choice) or a row count");
  if (int8_rows == -1) int8_rows = quant_int8_rows(bits);
  // The AVX2 path (the Python side runs it only where cpu_portable_supported() says so), but for the int8
  // path where AVX-512 BW runs.
  if (!avx512 && !(isa != Int8Isa::kAvx2 && m <= int8_rows)) {
    quant_gemm_avx2(x_in, w, key, sub, yp, ldy, n, int8_rows);
    return;
  }
  if (m <= int8_rows) {
    const bool rows_in_place = x_in.stride(1) == 1 && (x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16);
    const at::Tensor xc = rows_in_place ? x_in : x_in.to(at::kFloat).contiguous();
    const int64_t ldx = xc.stride(0);
    bool served = true;
    for (int64_t r0 = 0; r0 < m && served; r0 += kInt8SlabRows) {
      const int64_t rows = std::min(kInt8SlabRows, m - r0);
      QuantizedRows xr = xc.scalar_type() == at::kFloat
                             ? quantize_rows(xc.data_ptr<float>() + r0 * ldx, ldx, rows, k, sub)
                             : quantize_rows(xc.data_ptr<at::BFloat16>() + r0 * ldx, ldx, rows, k, sub);
      if (isa != Int8Isa::kVnni) xr.x16 = joined_terms(xr, rows);
      served = with_format(key, [&]<int BITS, int SUB, bool SC, bool MIN>() {
        if (isa == Int8Isa::kVnni)
          run_vnni<true, BITS, SUB, SC, MIN>(xr, rows, w, yp + r0 * ldy, ldy, n);
        else
          run_vnni<false, BITS, SUB, SC, MIN>(xr, rows, w, yp + r0 * ldy, ldy, n);
      });
    }
    TORCH_CHECK(served || avx512, "quant_gemm: no kernel for ", bits, "-bit codes, sub-block ", sub);
    if (served) return;  // else reported below
  }
  const at::Tensor x = x_in.to(at::kBFloat16).contiguous();
  const auto* xp = reinterpret_cast<const int32_t*>(x.data_ptr<at::BFloat16>());
  if (m >= dequant_rows(has_min)) {
    const bool amx = amx_bf16_ready();
    at::Tensor padded = x;  // AMX tiles read 16 rows at a time
    if (amx && m % 16 != 0) {
      padded = at::zeros({(m + 15) / 16 * 16, k}, x.options());
      padded.narrow(0, 0, m).copy_(x);
    }
    const auto* xa = reinterpret_cast<const uint16_t*>(padded.data_ptr<at::BFloat16>());
    const bool dequantized = with_format(key, [&]<int BITS, int SUB, bool SC, bool MIN>() {
      if (amx)
        run_dequantized_amx<BITS, SUB, SC, MIN>(xa, m, k, w, yp, ldy, n);
      else
        run_dequantized<BITS, SUB, SC, MIN>(xp, m, k, w, yp, ldy, n);
    });
    TORCH_CHECK(dequantized, "quant_gemm: no kernel for ", bits, "-bit codes, sub-block ", sub);
    return;
  }
  at::Tensor xsum;
  if (has_min) {  // sums of the bf16 x over each sub-block, for the offset term
    xsum = x.to(at::kFloat).view({m, k / sub, sub}).sum(-1).contiguous();
  }
  const float* sp = has_min ? xsum.data_ptr<float>() : nullptr;
  const bool served = with_format(key, [&]<int BITS, int SUB, bool SC, bool MIN>() {
    run<BITS, SUB, SC, MIN>(xp, m, k, sp, w, yp, ldy, n);
  });
  TORCH_CHECK(served, "quant_gemm: no kernel for ", bits, "-bit codes, sub-block ", sub,
              has_sc ? ", sub-block scales" : "", has_min ? ", offsets" : "");
}

// quant_gemm into a new float32 [M, n] output.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& d, const at::Tensor& sc,
                        const at::Tensor& dm, const at::Tensor& mc, int64_t bits, int64_t sub, int64_t zero, int64_t n) {
  TORCH_CHECK(x.dim() == 2, "quant_gemm: x must be 2-D");
  at::Tensor out = at::empty({x.size(0), n}, x.options().dtype(at::kFloat));
  quant_gemm(x, codes, d, sc, dm, mc, bits, sub, zero, out);
  return out;
}

// Rows from which quant_gemm's many-rows path multiplies dequantized bf16 tiles (the AVX-512 build only).
int64_t quant_dequant_rows(bool offsets) {
  static const bool avx512 = cpu_supported();
  return avx512 ? dequant_rows(offsets) : kEveryRow;
}

// The kernel's own many-rows threshold for this CPU kind (AVX-512 build; the AVX2 build has no such path).
int64_t quant_dequant_rows_builtin(bool offsets) {
  static const bool avx512 = cpu_supported();
  return avx512 ? dequant_rows_builtin(offsets) : kEveryRow;
}

// Sets quant_dequant_rows(offsets) for this process (a row count from 1); -1 restores the built-in threshold.
void set_quant_dequant_rows(bool offsets, int64_t rows) {
  TORCH_CHECK(rows == -1 || rows >= 1, "set_quant_dequant_rows: rows must be -1 (the built-in threshold) or >= 1");
  g_dequant_rows_set[offsets].store(rows, std::memory_order_relaxed);
}

// Whether the kernels with an AVX2 build run on this CPU (AVX-512 with BF16 and VNNI, or AVX2 with FMA and
// F16C): quant_gemm, quant_linear, quant_rows, rms_norm_f32, decode_attention and rope_write_kv.
bool cpu_portable_supported() { return cpu_supported() || cpu_supports_avx2(); }

TORCH_LIBRARY_FRAGMENT(sarathi_kernels, lib) {
  lib.def("cpu_portable_supported() -> bool", &cpu_portable_supported);
  lib.def("cpu_int8_isa() -> str", &cpu_int8_isa);
  lib.def("quant_int8_rows(int bits) -> int", &quant_int8_rows);
  lib.def("quant_dequant_rows(bool offsets) -> int", &quant_dequant_rows);
  lib.def("quant_dequant_rows_builtin(bool offsets) -> int", &quant_dequant_rows_builtin);
  lib.def("set_quant_dequant_rows(bool offsets, int rows) -> ()", &set_quant_dequant_rows);
  lib.def("quant_int8_rows_builtin(int bits) -> int", &quant_int8_rows_builtin);
  lib.def("set_quant_int8_rows(int bits, int rows) -> ()", &set_quant_int8_rows);
  lib.def("quant_linear(Tensor x, Tensor codes, Tensor d, Tensor sc, Tensor dm, Tensor mc, int bits, int sub, int zero, "
          "int n) -> Tensor",
          &quant_linear);
  lib.def("quant_gemm(Tensor x, Tensor codes, Tensor d, Tensor sc, Tensor dm, Tensor mc, int bits, int sub, int zero, "
          "Tensor(a!) out, int int8_rows=-1) -> ()",
          &quant_gemm);
}

}  // namespace sarathi_kernels
