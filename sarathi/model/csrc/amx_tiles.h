// bf16 products on AMX tiles (Intel Advanced Matrix Extensions: Xeon Sapphire Rapids and later), for the GEMMs
// whose weights are already in the pair layout: bf16_gemm's packed weights and quant_gemm's dequantized chunks.
//
// That layout (per block of 16 columns, pair p = positions 2p, 2p + 1: 32 bf16, lane 2c + j = column c at
// position 2p + j) is what TDPBF16PS takes as its B operand: 16 pairs of a block (32 positions) are one 16 x 64
// byte tile. A rows of x are the A operand as they lie in memory (16 rows x 32 positions), and the 16 x 16
// float32 result tile is y's own layout: nothing is rearranged. TDPBF16PS sums bf16 products in float32, as
// VDPBF16PS does: the precision of our bf16 GEMM, at up to 16x its products per instruction.
//
// Include it outside any target pragma: its functions carry their own target attributes.

#pragma once

#include <immintrin.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace sarathi_kernels {

// Whether this process may run AMX bf16 tile instructions: the CPU has them (CPUID 7.0 EDX bits 22 and 24), the
// OS saves tile state (XCR0 bits 17 and 18) and Linux granted this process the tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM, once; without it the first tile instruction kills the process). SARATHI_AMX=0 turns
// the tiles off (to time and test the AVX-512 paths on such a CPU).
inline bool amx_bf16_ready() {
  static const bool ready = [] {
    const char* choice = std::getenv("SARATHI_AMX");
    if (choice != nullptr && std::strcmp(choice, "0") == 0) return false;
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24))) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE: xgetbv runs
    uint32_t lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
  }();
  return ready;
}

// Every tile 16 rows x 64 bytes: tmm0-3 results, tmm4-5 rows of x, tmm6-7 weight blocks.
struct alignas(64) AmxConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Loads the tile configuration on the calling thread; each thread (and each parallel task: other libraries'
// tile code may run on the same thread between our calls) begins with it and ends with amx_end().
__attribute__((target("amx-tile"))) inline void amx_begin() {
  AmxConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  // not _tile_loadconfig: GCC's declares a pointer-sized read, and the stores above were dropped as dead
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

__attribute__((target("amx-tile"))) inline void amx_end() { _tile_release(); }

// y[rows, cols] (float32, row stride ldy) = (first ? 0 : y) + x[:, 32 * groups] @ B for MT x NT result tiles of
// 16 x 16: x is 16 * MT rows of bf16 (ldx elements apart; rows past `rows` must be readable: their results are
// dropped), B is NT blocks of 16 columns in the pair layout, block j at b + j * bstride elements, group g (16
// pairs) of it at g * 512. Tile numbers are literals in GCC's intrinsics, hence the spelled-out cases.
template <int MT, int NT>
__attribute__((target("amx-tile,amx-bf16,avx512f"))) void amx_block(const uint16_t* x, int64_t ldx, const uint16_t* b,
                                                                    int64_t bstride, int64_t groups, float* y, int64_t ldy,
                                                                    int rows, int cols, bool first) {
  static_assert((MT == 1 || MT == 2) && (NT == 1 || NT == 2));
  const bool whole = rows == 16 * MT && cols == 16 * NT;
  alignas(64) float part[32 * 32];  // a partial result block goes through here
  float* c = y;
  int64_t ldc = ldy;
  if (!whole) {
    c = part, ldc = 32;
    std::memset(part, 0, sizeof(part));
    if (!first)
      for (int r = 0; r < rows; ++r) std::memcpy(part + r * 32, y + r * ldy, cols * sizeof(float));
  }
  const int64_t cstride = ldc * 4, xstride = ldx * 2;
  if (first) {
    _tile_zero(0);
    if constexpr (NT == 2) _tile_zero(1);
    if constexpr (MT == 2) _tile_zero(2);
    if constexpr (MT == 2 && NT == 2) _tile_zero(3);
  } else {
    _tile_loadd(0, c, cstride);
    if constexpr (NT == 2) _tile_loadd(1, c + 16, cstride);
    if constexpr (MT == 2) _tile_loadd(2, c + 16 * ldc, cstride);
    if constexpr (MT == 2 && NT == 2) _tile_loadd(3, c + 16 * ldc + 16, cstride);
  }
  for (int64_t g = 0; g < groups; ++g) {
    _tile_loadd(4, x + g * 32, xstride);
    if constexpr (MT == 2) _tile_loadd(5, x + 16 * ldx + g * 32, xstride);
    _tile_loadd(6, b + g * 512, 64);
    if constexpr (NT == 2) _tile_loadd(7, b + bstride + g * 512, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (NT == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (MT == 2) _tile_dpbf16ps(2, 5, 6);
    if constexpr (MT == 2 && NT == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cstride);
  if constexpr (NT == 2) _tile_stored(1, c + 16, cstride);
  if constexpr (MT == 2) _tile_stored(2, c + 16 * ldc, cstride);
  if constexpr (MT == 2 && NT == 2) _tile_stored(3, c + 16 * ldc + 16, cstride);
  if (!whole)
    for (int r = 0; r < rows; ++r) std::memcpy(y + r * ldy, part + r * 32, cols * sizeof(float));
}

// y[m, cols] (+)= x[m, 32 * groups] @ B over `nb` blocks of 16 columns (cols of them valid), x padded to a
// multiple of 16 rows: amx_block over every 32 rows x 2 blocks, inside amx_begin()/amx_end() of the caller.
__attribute__((target("amx-tile,amx-bf16,avx512f"))) inline void amx_rows(const uint16_t* x, int64_t ldx, int64_t m,
                                                                          const uint16_t* b, int64_t bstride, int nb,
                                                                          int64_t groups, float* y, int64_t ldy,
                                                                          int64_t cols, bool first) {
  for (int64_t r = 0; r < m; r += 32) {
    const int rows = static_cast<int>(std::min<int64_t>(32, m - r));
    const uint16_t* xr = x + r * ldx;
    float* yr = y + r * ldy;
    for (int j = 0; j < nb; j += 2) {
      const int bcols = static_cast<int>(std::min<int64_t>(cols - 16 * j, nb - j >= 2 ? 32 : 16));
      const uint16_t* bj = b + j * bstride;
      float* yj = yr + 16 * j;
      if (rows > 16) {
        if (nb - j >= 2)
          amx_block<2, 2>(xr, ldx, bj, bstride, groups, yj, ldy, rows, bcols, first);
        else
          amx_block<2, 1>(xr, ldx, bj, bstride, groups, yj, ldy, rows, bcols, first);
      } else if (nb - j >= 2) {
        amx_block<1, 2>(xr, ldx, bj, bstride, groups, yj, ldy, rows, bcols, first);
      } else {
        amx_block<1, 1>(xr, ldx, bj, bstride, groups, yj, ldy, rows, bcols, first);
      }
    }
  }
}

}  // namespace sarathi_kernels
