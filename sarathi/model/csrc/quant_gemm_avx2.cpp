// quant_gemm's path for CPUs without AVX-512 BF16 and VNNI (AMD Zen 2/3, Intel before Cooper Lake), over the
// same packed weights, read in place.
// - Up to int8_up_to_rows_avx2(bits) rows: x in the same two int8 terms as the VNNI path (quant_layout.h). VPMADDUBSW
//   multiplies unsigned codes by signed int8 x into int16 pair sums; these add up in int16 over as many quads
//   as cannot overflow (kQuadsPerFlush), then VPMADDWD widens them to int32 (with the 256 of x's first term):
//   the 4-position sums VPDPBUSD makes. 4- to 6-bit codes (<= 63) cannot overflow one pair (2 * 63 * 127);
//   8-bit codes are taken as signed bytes, their signs moved onto x (VPSIGNB), so pairs stay within
//   2 * 128 * 127. Exact integer sums until the per-sub-block float32 scaling. One row reads the codes from
//   memory near the rate of a plain sum over a large tensor only with the codes prefetched well ahead. From
//   2 rows, 8-bit codes meet x's two terms joined into one int16 instead (VPMADDWD; tile_rows_wide).
// - More rows: float32 x times the codes dequantized to float32 once per chunk of a tile (exact codes and
//   scales, each weight rounded once, as the gguf package dequantizes), a 6 x 16 FMA register tile.
//
// A tile of 16 output columns is two 8-lane halves: half h of quad r is bytes 32h..32h+31 of its 64.

#include "parallel_ranges.h"  // before the target pragma: plain x86-64 code
#include "quant_layout.h"

#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#pragma GCC target("avx2,fma,f16c")

namespace sarathi_kernels {
namespace {

constexpr int kMaxRows = 2;  // rows of x per two-half register tile (fewer rows than a one-half tile takes)
// Rows up to which x is multiplied in int8 terms; more rows: float32 x times chunks dequantized once per tile.
// Measured on a Zen3 at 8,192 x 2,048 (benchmarks/quant_kernel.py): with the int16 pair sums the int8 terms
// are faster up to 32 rows for 4-bit codes (1.2-1.7x at 9-32 rows, even at 48-64), up to 16 for 5- and
// 6-bit ones (1.2x at 16; 0.7x for Q6_K at 48). 8-bit codes: 32, measured only on a Zen5's AVX2 path since
// tile_rows_wide: 0.72x the float path's time at 32 rows, 0.81-0.87x at 48-128 (the old 8-bit kernel was
// 1.05x the float path at 16 rows on the Zen3 and 0.85x on the Zen5: the Zen5 flatters it by ~20%).
constexpr int kInt8UpToRows4 = 32, kInt8UpToRows8 = 32, kInt8UpToRowsWider = 16;
constexpr int64_t kPrefetchBytes = 4096;  // codes fetched ahead of the group in hand

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

// Four vectors of 8 int32 (each within int8) -> 32 int8 in order.
inline __m256i pack_bytes(const __m256i (&v)[4]) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
  return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// One row of x into its two int8 terms, as quant_gemm.cpp's quantize_row (same values).
template <typename T>
void quantize_row(const T* x, int64_t k, int sub, int8_t* q1, int8_t* q2, float* dx, int32_t* isum, float* xsum) {
  const __m256 fine = _mm256_set1_ps(static_cast<float>(kFine)), abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  for (int64_t b = 0; b < k / kGroup; ++b) {
    __m256 xv[4];
    for (int v = 0; v < 4; ++v) xv[v] = load8(x + b * kGroup + 8 * v);
    const float amax = hmax(_mm256_max_ps(_mm256_max_ps(_mm256_and_ps(xv[0], abs_mask), _mm256_and_ps(xv[1], abs_mask)),
                                          _mm256_max_ps(_mm256_and_ps(xv[2], abs_mask), _mm256_and_ps(xv[3], abs_mask))));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    dx[b] = amax / (127.0f * kFine);
    __m256i c[4], f[4], sums[4];
    for (int v = 0; v < 4; ++v) {
      const __m256 t = _mm256_mul_ps(xv[v], inv);
      c[v] = _mm256_cvtps_epi32(t);  // round to nearest even
      f[v] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t, _mm256_cvtepi32_ps(c[v])), fine));
      f[v] = _mm256_min_epi32(_mm256_max_epi32(f[v], _mm256_set1_epi32(-127)), _mm256_set1_epi32(127));
      sums[v] = _mm256_add_epi32(_mm256_slli_epi32(c[v], kFineShift), f[v]);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q1 + b * kGroup), pack_bytes(c));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q2 + b * kGroup), pack_bytes(f));
    if (sub == kGroup) {
      isum[b] = hsum(_mm256_add_epi32(_mm256_add_epi32(sums[0], sums[1]), _mm256_add_epi32(sums[2], sums[3])));
      xsum[b] = hsum(_mm256_add_ps(_mm256_add_ps(xv[0], xv[1]), _mm256_add_ps(xv[2], xv[3])));
    } else {  // 16
      isum[2 * b] = hsum(_mm256_add_epi32(sums[0], sums[1]));
      isum[2 * b + 1] = hsum(_mm256_add_epi32(sums[2], sums[3]));
      xsum[2 * b] = hsum(_mm256_add_ps(xv[0], xv[1]));
      xsum[2 * b + 1] = hsum(_mm256_add_ps(xv[2], xv[3]));
    }
  }
}

// Rows of x quantized into a per-thread buffer reused across calls.
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
  at::parallel_for(0, m, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      quantize_row(x + i * ldx, k, static_cast<int>(sub), q + i * k, q + (m + i) * k, dx + i * blocks,
                   isum + i * nsub, xsum + i * nsub);
  });
  return {q, q + m * k, dx, isum, xsum, k, sub};
}

// Bit r of every byte of a bit plane moved to bit `to`, the others cleared. A 16-bit shift moves bits across
// the byte boundary, but the bits the mask keeps come from their own byte (r and `to` are both below 8); with
// r a constant (the callers' loops are unrolled) this is two instructions.
inline __m256i plane_bit(__m256i plane, int r, int to) {
  const __m256i moved = r > to ? _mm256_srli_epi16(plane, r - to) : r < to ? _mm256_slli_epi16(plane, to - r) : plane;
  return _mm256_and_si256(moved, _mm256_set1_epi8(static_cast<char>(1 << to)));
}

// IQ4's table (quant_layout.h) in both 128-bit lanes, as signed bytes or as unsigned ones (value + 128).
inline __m256i iq4_table(bool plus128) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
  return _mm256_broadcastsi128_si256(plus128 ? _mm_xor_si128(t, _mm_set1_epi8(static_cast<char>(0x80))) : t);
}

// Half h (columns 8h..8h+7) of quad r of a group's codes: 32 bytes, byte 4c + i = code at position 4r + i.
// 8-bit codes come back as signed bytes q - z (stored + 128), IQ4's as the table's signed values; narrower
// ones as unsigned codes.
template <int BITS>
inline __m256i quad_half(const uint8_t* codes, int r, int h) {
  if constexpr (BITS == 8) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * r + 32 * h)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (BITS == kIq4Codes) {
    return _mm256_shuffle_epi8(iq4_table(false), quad_half<4>(codes, r, h));
  } else if constexpr (BITS < 4) {  // the 2-bit rows (and the 3-bit plane), quant_gemm.cpp's header
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * (r / 4) + 32 * h));
    __m256i q = _mm256_and_si256(_mm256_srli_epi16(packed, 2 * (r % 4)), _mm256_set1_epi8(3));
    if constexpr (BITS == 3)
      q = _mm256_or_si256(q, plane_bit(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 128 + 32 * h)), r, 2));
    return q;
  } else if constexpr (BITS == 6) {  // the layout in quant_gemm.cpp's header
    const __m256i whole = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * (r & 3) + 32 * h));
    if (r < 4) return _mm256_and_si256(whole, _mm256_set1_epi8(0x3F));
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 256 + 64 * ((r - 4) / 2) + 32 * h));
    const __m256i low = _mm256_and_si256(r % 2 ? _mm256_srli_epi16(packed, 4) : packed, _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(low, _mm256_and_si256(_mm256_srli_epi16(whole, 2), _mm256_set1_epi8(0x30)));
  } else {
    const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * (r & 3) + 32 * h));
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    __m256i q = r < 4 ? _mm256_and_si256(packed, nibble) : _mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble);
    if constexpr (BITS == 5)
      q = _mm256_or_si256(q, plane_bit(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 256 + 32 * h)), r, 4));
    return q;
  }
}

// Codes times x over 4 positions per column as int16 pair sums (VPMADDUBSW). 8-bit codes (and IQ4's values)
// are signed: |u| times x with u's sign.
template <int BITS>
inline __m256i pairs(__m256i u, __m256i x) {
  if constexpr (byte_valued(BITS)) return _mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(x, u));
  return _mm256_maddubs_epi16(u, x);
}

// Quads whose int16 pair sums add up without overflow before they are widened to int32 (VPMADDWD): a pair
// is at most 2 * max code * 127, so 8 quads of 4-bit codes (30,480), 4 of 5-bit (31,496), 2 of 6-bit
// (32,004), 1 of 8-bit. Widening once per flush, not per quad, halves the multiplies per code.
// A register the compiler must hold at this point: it keeps the sums below as running chains. Left to
// itself, GCC reassociates an unrolled chain of integer adds into a tree and spills the unrolled terms to the
// stack (measured 1.4x slower at one row).
inline void hold(__m256i& v) { asm("" : "+x"(v)); }

template <int BITS>
constexpr int kQuadsPerFlush = BITS <= 4 ? 8 : BITS == 5 ? 4 : BITS == 6 ? 2 : 1;  // IQ4's values: 1, as 8-bit

inline __m256 halves8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m256 bytes8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 bytes8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Half h of a sub-block's scale s = d (* sc) and offset m = dm (* mc) (zero without offsets); super_at and
// sub_at index the tile's super-block and sub-block rows of d / dm and sc / mc.
template <bool SC>
inline __m256 sub_scale(const Weight& w, int64_t super_at, int64_t sub_at, int h) {
  const __m256 d = halves8(w.d + super_at + 8 * h);
  if constexpr (SC) return _mm256_mul_ps(d, bytes8(w.sc + sub_at + 8 * h));
  return d;
}
template <bool SC, bool MIN>
inline __m256 sub_shift(const Weight& w, int64_t super_at, int64_t sub_at, int h) {
  if constexpr (!MIN) return _mm256_setzero_ps();
  const __m256 dm = halves8(w.dm + super_at + 8 * h);
  if constexpr (SC) return _mm256_mul_ps(dm, bytes8(w.mc + sub_at + 8 * h));
  return dm;
}

// A row's int32 sums over one sub-block half, d, into its float32 sums: acc + d * s * dx (+ m * sum of x).
template <bool MIN>
inline __m256 add_sub_block(__m256 acc, __m256i d, __m256 scale, __m256 shift, float dx, float xsum) {
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(scale, _mm256_set1_ps(dx)), acc);
  if constexpr (MIN) acc = _mm256_fmadd_ps(shift, _mm256_set1_ps(xsum), acc);
  return acc;
}

// MR rows of NH halves of a tile's float32 sums into y; `cols` of the NH * 8 columns from y on are valid.
template <int MR, int NH>
inline void store_rows(const __m256 (&acc)[MR][NH], float* y, int64_t ldy, int64_t cols) {
  alignas(32) float rows[MR][8 * NH];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; ++hh) _mm256_store_ps(rows[i] + 8 * hh, acc[i][hh]);
  const int64_t valid = std::min<int64_t>(8 * NH, cols);
  for (int i = 0; i < MR; ++i) std::memcpy(y + i * ldy, rows[i], valid * sizeof(float));
}

// MR rows of x against NH halves of one tile from half h0 on (NH = 2: all 16 columns, `cols` of them valid),
// the whole depth. One half (NH = 1) leaves a row one float32 accumulator instead of two, so 4 rows of 4-bit
// codes (3 of 5- and 6-bit ones, whose int32 sums need registers too) fit the 16 registers and each quad's
// unpacked codes serve that many rows: 0.91-0.96x the time of 2-row tiles from 4 to 64 rows on a Zen5's AVX2
// path (Q4_K; Q5_K and Q6_K 0.91-0.94x from 16 rows). The second half re-reads the tile's lines from L1/L2,
// where the row tiles before it left them; one or two rows keep both halves in one pass over the codes.
template <int BITS, int MR, int NH, int SUB, bool SC, bool MIN>
void tile_rows(const QuantizedRows& x, const Weight& w, int64_t tile, int h0, float* y, int64_t ldy, int64_t cols) {
  constexpr int kSubsPerGroup = kGroup / SUB, kQuadsPerSub = SUB / 4;
  constexpr int kFlush = std::min(kQuadsPerFlush<BITS>, kQuadsPerSub);  // a sub-block's sums widen by its end
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  const int64_t bytes = group_bytes(BITS), ldb = x.k / kGroup, ldsub = x.k / SUB;
  const int32_t zero = byte_valued(BITS) ? 0 : w.zero;
  // Every loop over the register tile is unrolled: GCC keeps arrays of vectors in registers only when each
  // index is a constant (otherwise it spills them to the stack on every iteration).
  __m256 acc[MR][NH];
#pragma GCC unroll 4
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 2
    for (int hh = 0; hh < NH; ++hh) acc[i][hh] = _mm256_setzero_ps();
  const uint8_t* tile_codes = w.codes + tile * w.groups * bytes;
  const bool intel = intel_cpu();
  for (int64_t g = 0; g < w.groups; ++g) {
    const uint8_t* codes = tile_codes + g * bytes;
    if (h0 == 0) prefetch_codes(codes, bytes, kPrefetchBytes, intel);
#pragma GCC unroll 2
    for (int s = 0; s < kSubsPerGroup; ++s) {
      const int64_t sub = g * kSubsPerGroup + s, sup = sub / subs_per_super;
      const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
      // One half at a time: the halves share no codes, and the live vectors of one half fit the 16 registers.
#pragma GCC unroll 2
      for (int hh = 0; hh < NH; ++hh) {
        const int h = h0 + hh;
        __m256i dot[MR], p1[MR], p2[MR];  // int32 sums; int16 pair sums of x's two terms
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) dot[i] = _mm256_setzero_si256();
        // Fully unrolled, so that r, and with it the nibble half and the flush points, are constants.
#pragma GCC unroll 8
        for (int t = 0; t < kQuadsPerSub; ++t) {
          const int r = s * kQuadsPerSub + t;
          const __m256i u = quad_half<BITS>(codes, r, h);
          const bool opens = t % kFlush == 0, closes = (t + 1) % kFlush == 0;
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            int32_t four1, four2;
            std::memcpy(&four1, x.q1 + i * x.k + g * kGroup + 4 * r, 4);
            std::memcpy(&four2, x.q2 + i * x.k + g * kGroup + 4 * r, 4);
            const __m256i s1 = pairs<BITS>(u, _mm256_set1_epi32(four1)), s2 = pairs<BITS>(u, _mm256_set1_epi32(four2));
            p1[i] = opens ? s1 : _mm256_add_epi16(p1[i], s1);
            p2[i] = opens ? s2 : _mm256_add_epi16(p2[i], s2);
            hold(p1[i]), hold(p2[i]);
            if (closes) {  // 256 * (codes . x1) + codes . x2, widened to int32
              const __m256i wide = _mm256_add_epi32(_mm256_madd_epi16(p1[i], _mm256_set1_epi16(kFine)),
                                                    _mm256_madd_epi16(p2[i], _mm256_set1_epi16(1)));
              dot[i] = _mm256_add_epi32(dot[i], wide);
              hold(dot[i]);
            }
          }
        }
        const __m256 scale = sub_scale<SC>(w, super_at, sub_at, h), shift = sub_shift<SC, MIN>(w, super_at, sub_at, h);
#pragma GCC unroll 4
        for (int i = 0; i < MR; ++i) {
          __m256i d = dot[i];
          if (zero != 0) d = _mm256_sub_epi32(d, _mm256_set1_epi32(zero * x.isum[i * ldsub + sub]));
          acc[i][hh] = add_sub_block<MIN>(acc[i][hh], d, scale, shift, x.dx[i * ldb + g], x.xsum[i * ldsub + sub]);
        }
      }
    }
  }
  store_rows<MR, NH>(acc, y + 8 * h0, ldy, cols - 8 * h0);
}

// 8-bit codes against x's two terms joined into one int16, 256 * q1 + q2 (|.| <= 32,639): VPMADDWD multiplies
// codes widened to int16 (once per quad, shared by the rows) by x in int32 pair sums, which add up over a
// whole sub-block without overflow (16 products of |code| <= 255 and |x| <= 32,639 per lane). Per row and quad
// half that is two VPMADDWD and two adds, where the int8 terms take two VPSIGNB, two VPMADDUBSW, two VPMADDWD
// and two adds (8-bit codes cannot stay unsigned there: a pair of 255 * 127 overflows int16). The same
// integer sums. Codes are the stored q - z + 128, the 128 taken off with x's sums like a zero point. On the
// AVX2 path of a Zen5 (SARATHI_KERNELS=avx2) Q8_0 at 8 / 16 / 32 rows took 0.77 / 0.72 / 0.71x the int8
// terms' time; narrower codes, whose int16 pair sums already add up over several quads, took 1.1-1.25x (kept
// on the int8 terms). One row stays there too: its time is the memory's.
template <int BITS, int MR, int SUB, bool SC, bool MIN>
void tile_rows_wide(const int16_t* x16, const QuantizedRows& x, const Weight& w, int64_t tile, float* y, int64_t ldy,
                    int64_t cols) {
  constexpr int kSubsPerGroup = kGroup / SUB, kQuadsPerSub = SUB / 4;
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  constexpr int64_t bytes = group_bytes(BITS);
  const int64_t ldb = x.k / kGroup, ldsub = x.k / SUB;
  __m256 acc[MR][2];
#pragma GCC unroll 2
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  const uint8_t* tile_codes = w.codes + tile * w.groups * bytes;
  const bool intel = intel_cpu();
  for (int64_t g = 0; g < w.groups; ++g) {
    const uint8_t* codes = tile_codes + g * bytes;
    prefetch_codes(codes, bytes, kPrefetchBytes, intel);
#pragma GCC unroll 2
    for (int s = 0; s < kSubsPerGroup; ++s) {
      const int64_t sub = g * kSubsPerGroup + s, sup = sub / subs_per_super;
      const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        __m256i lo[MR], hi[MR];  // lanes: column c's positions (0, 1) and (2, 3), columns 0-3 / 4-7 of the half
#pragma GCC unroll 2
        for (int i = 0; i < MR; ++i) lo[i] = hi[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int t = 0; t < kQuadsPerSub; ++t) {
          const int r = s * kQuadsPerSub + t;
          // the stored q - z + 128, or IQ4's value + 128
          const __m256i u = BITS == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * r + 32 * h))
                                      : _mm256_shuffle_epi8(iq4_table(true), quad_half<4>(codes, r, h));
          const __m256i c0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(u));
          const __m256i c1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(u, 1));
#pragma GCC unroll 2
          for (int i = 0; i < MR; ++i) {
            int64_t four;
            std::memcpy(&four, x16 + i * x.k + g * kGroup + 4 * r, 8);
            const __m256i xq = _mm256_set1_epi64x(four);
            lo[i] = _mm256_add_epi32(lo[i], _mm256_madd_epi16(c0, xq));
            hi[i] = _mm256_add_epi32(hi[i], _mm256_madd_epi16(c1, xq));
            hold(lo[i]), hold(hi[i]);
          }
        }
        const __m256 scale = sub_scale<SC>(w, super_at, sub_at, h), shift = sub_shift<SC, MIN>(w, super_at, sub_at, h);
#pragma GCC unroll 2
        for (int i = 0; i < MR; ++i) {
          // [c0 c1 | c4 c5 | c2 c3 | c6 c7] -> columns in order
          const __m256i dot = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[i], hi[i]), 0xD8);
          const __m256i d = _mm256_sub_epi32(dot, _mm256_set1_epi32(128 * x.isum[i * ldsub + sub]));
          acc[i][h] = add_sub_block<MIN>(acc[i][h], d, scale, shift, x.dx[i * ldb + g], x.xsum[i * ldsub + sub]);
        }
      }
    }
  }
  store_rows<MR, 2>(acc, y, ldy, cols);
}

// x's two int8 terms joined, 256 * q1 + q2, as int16 rows [m, k] (a per-thread buffer reused across calls).
const int16_t* joined_terms(const QuantizedRows& x, int64_t m) {
  static thread_local std::vector<int16_t> buffer;
  buffer.resize(static_cast<size_t>(m * x.k));
  const __m256i fine = _mm256_set1_epi16(kFine);
  for (int64_t j = 0; j < m * x.k; j += 16) {  // k is a multiple of 32
    const __m256i q1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.q1 + j)));
    const __m256i q2 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.q2 + j)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(buffer.data() + j), _mm256_add_epi16(_mm256_mullo_epi16(q1, fine), q2));
  }
  return buffer.data();
}

template <int BITS, int SUB, bool SC, bool MIN>
void run(const QuantizedRows& x, int64_t m, const Weight& w, float* y, int64_t ldy, int64_t n) {
  const int64_t tiles = (n + kCols - 1) / kCols;
  const int16_t* x16 = byte_valued(BITS) && m > 1 ? joined_terms(x, m) : nullptr;
  // claims of ~64 KiB of codes, the rest taken by whichever thread runs out first (parallel_ranges.h)
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / (w.groups * group_bytes(BITS)));
  parallel_stealing(tiles, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t col0 = t * kCols, cols = std::min<int64_t>(kCols, n - col0);
      int64_t r = 0;
      if constexpr (!byte_valued(BITS)) {  // 8-bit codes (IQ4's values) from 2 rows: tile_rows_wide
        constexpr int kHalfRows = BITS <= 4 ? 4 : 3;
        for (; m - r >= kHalfRows; r += kHalfRows)  // the tile's codes stay in L1/L2 across row tiles
          for (int h = 0; h < 2 && 8 * h < cols; ++h)
            tile_rows<BITS, kHalfRows, 1, SUB, SC, MIN>(x.rows_from(r), w, t, h, y + r * ldy + col0, ldy, cols);
      }
      for (; r < m; r += kMaxRows) {
        const QuantizedRows xr = x.rows_from(r);
        float* yr = y + r * ldy + col0;
        if constexpr (byte_valued(BITS)) {
          if (x16 != nullptr) {
            if (m - r >= 2)
              tile_rows_wide<BITS, 2, SUB, SC, MIN>(x16 + r * x.k, xr, w, t, yr, ldy, cols);
            else
              tile_rows_wide<BITS, 1, SUB, SC, MIN>(x16 + r * x.k, xr, w, t, yr, ldy, cols);
            continue;
          }
        }
        if (m - r >= 2)
          tile_rows<BITS, 2, 2, SUB, SC, MIN>(xr, w, t, 0, yr, ldy, cols);
        else
          tile_rows<BITS, 1, 2, SUB, SC, MIN>(xr, w, t, 0, yr, ldy, cols);
      }
    }
  });
}

// ---- Many rows: codes dequantized to float32 once per chunk, a float32 GEMM over the chunk ----

constexpr int kChunkGroups = 8;  // groups dequantized at a time per tile: 256 positions x 16 columns, 16 KiB
constexpr int kFloatRows = 6;    // rows of x per register tile: 6 x 2 accumulators, 2 weights, 1 broadcast

// Half h of quad r, transposed: bytes 8p..8p+7 = the 8 columns' codes at position 4r + p.
inline __m256i by_position(__m256i u) {
  const __m256i within = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                          0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(u, within), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// The weights of groups g0..g0+ng of one tile as float32, [position][16 columns], into out: s * (q - z) + m,
// each a float32 rounding of the file's value (as the gguf package dequantizes).
template <int BITS, int SUB, bool SC, bool MIN>
void dequantize_chunk(const Weight& w, int64_t tile, int64_t g0, int ng, float* out) {
  constexpr int kSubsPerGroup = kGroup / SUB, kQuadsPerSub = SUB / 4;
  constexpr int64_t subs_per_super = kSubsPerSuper<SUB, SC>;
  const int64_t bytes = group_bytes(BITS);
  const __m256 zero = _mm256_set1_ps(byte_valued(BITS) ? 0.0f : static_cast<float>(w.zero));
  alignas(32) uint8_t t[32];
  for (int g = 0; g < ng; ++g) {
    const uint8_t* codes = w.codes + (tile * w.groups + g0 + g) * bytes;
    for (int s = 0; s < kSubsPerGroup; ++s) {
      const int64_t sub = (g0 + g) * kSubsPerGroup + s, sup = sub / subs_per_super;
      const int64_t super_at = (tile * w.supers + sup) * kCols, sub_at = (tile * w.subs + sub) * kCols;
      for (int h = 0; h < 2; ++h) {
        const __m256 scale = sub_scale<SC>(w, super_at, sub_at, h), shift = sub_shift<SC, MIN>(w, super_at, sub_at, h);
        for (int q = 0; q < kQuadsPerSub; ++q) {
          const int r = s * kQuadsPerSub + q;
          _mm256_store_si256(reinterpret_cast<__m256i*>(t), by_position(quad_half<BITS>(codes, r, h)));
#pragma GCC unroll 4
          for (int p = 0; p < 4; ++p) {
            const __m128i eight = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(t + 8 * p));
            const __m256i v = byte_valued(BITS) ? _mm256_cvtepi8_epi32(eight) : _mm256_cvtepu8_epi32(eight);
            const __m256 value = _mm256_sub_ps(_mm256_cvtepi32_ps(v), zero);  // q - z, exact
            _mm256_store_ps(out + (g * kGroup + 4 * r + p) * kCols + 8 * h, _mm256_fmadd_ps(value, scale, shift));
          }
        }
      }
    }
  }
}

// MR rows of float32 x (row stride ldx) times `n` positions of a dequantized chunk: stored into y when `first`,
// else added to it; `cols` of the tile's 16 columns are valid.
template <int MR>
void float_rows(const float* x, int64_t ldx, const float* chunk, int n, float* y, int64_t ldy, int64_t cols,
                bool first) {
  __m256 acc[MR][2];  // in registers: every index below is a constant after unrolling
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int p = 0; p < n; ++p) {
    const __m256 w0 = _mm256_load_ps(chunk + p * kCols), w1 = _mm256_load_ps(chunk + p * kCols + 8);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 xb = _mm256_broadcast_ss(x + i * ldx + p);
      acc[i][0] = _mm256_fmadd_ps(xb, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xb, w1, acc[i][1]);
    }
  }
  alignas(32) float rows[MR][kCols];
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(rows[i], acc[i][0]);
    _mm256_store_ps(rows[i] + 8, acc[i][1]);
  }
  for (int i = 0; i < MR; ++i) {
    float* yi = y + i * ldy;
    if (first) {
      std::memcpy(yi, rows[i], cols * sizeof(float));
    } else {
      for (int64_t c = 0; c < cols; ++c) yi[c] += rows[i][c];
    }
  }
}

using FloatRowsFn = void (*)(const float*, int64_t, const float*, int, float*, int64_t, int64_t, bool);
constexpr FloatRowsFn kFloatRowsFns[kFloatRows + 1] = {nullptr,        &float_rows<1>, &float_rows<2>, &float_rows<3>,
                                                       &float_rows<4>, &float_rows<5>, &float_rows<6>};

template <int BITS, int SUB, bool SC, bool MIN>
void run_float(const float* x, int64_t ldx, int64_t m, const Weight& w, float* y, int64_t ldy, int64_t n) {
  const int64_t tiles = (n + kCols - 1) / kCols;
  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    alignas(32) float chunk[kChunkGroups * kGroup * kCols];
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t col0 = t * kCols, cols = std::min<int64_t>(kCols, n - col0);
      for (int64_t g0 = 0; g0 < w.groups; g0 += kChunkGroups) {
        const int ng = static_cast<int>(std::min<int64_t>(kChunkGroups, w.groups - g0));
        dequantize_chunk<BITS, SUB, SC, MIN>(w, t, g0, ng, chunk);
        for (int64_t r = 0; r < m; r += kFloatRows) {
          const int mr = static_cast<int>(std::min<int64_t>(kFloatRows, m - r));
          kFloatRowsFns[mr](x + r * ldx + g0 * kGroup, ldx, chunk, ng * kGroup, y + r * ldy + col0, ldy, cols,
                            g0 == 0);
        }
      }
    }
  });
}

}  // namespace

int64_t int8_up_to_rows_avx2(int64_t bits) {  // IQ4's values are multiplied as 8-bit codes are (tile_rows_wide)
  return bits <= 4 ? kInt8UpToRows4 : byte_valued(static_cast<int>(bits)) ? kInt8UpToRows8 : kInt8UpToRowsWider;
}

bool cpu_supports_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

void quant_gemm_avx2(const at::Tensor& x_in, const Weight& w, int key, int64_t sub, float* y, int64_t ldy, int64_t n,
                     int64_t int8_rows) {
  const int64_t m = x_in.size(0), k = x_in.size(1);
  if (m > int8_rows) {  // float32 x times the dequantized chunks
    const at::Tensor x = x_in.scalar_type() == at::kFloat && x_in.stride(1) == 1 ? x_in : x_in.to(at::kFloat).contiguous();
    const float* xp = x.data_ptr<float>();
    const int64_t ldx = x.stride(0);
    const bool served = with_format(key, [&]<int BITS, int SUB, bool SC, bool MIN>() {
      run_float<BITS, SUB, SC, MIN>(xp, ldx, m, w, y, ldy, n);
    });
    TORCH_CHECK(served, "quant_gemm: no AVX2 kernel for format key ", key);
    return;
  }
  const bool in_place = x_in.stride(1) == 1 && (x_in.scalar_type() == at::kFloat || x_in.scalar_type() == at::kBFloat16);
  const at::Tensor x = in_place ? x_in : x_in.to(at::kFloat).contiguous();
  const QuantizedRows xr = x.scalar_type() == at::kFloat
                               ? quantize_rows(x.data_ptr<float>(), x.stride(0), m, k, sub)
                               : quantize_rows(x.data_ptr<at::BFloat16>(), x.stride(0), m, k, sub);
  const bool served = with_format(key, [&]<int BITS, int SUB, bool SC, bool MIN>() {
    run<BITS, SUB, SC, MIN>(xr, m, w, y, ldy, n);
  });
  TORCH_CHECK(served, "quant_gemm: no AVX2 kernel for format key ", key);
}

}  // namespace sarathi_kernels
