// The packed layout of a GGUF-quantized weight (made by sarathi/model/quantized.py) and the int8 rows of x
// the few-rows paths multiply, shared by quant_gemm.cpp (AVX-512), quant_gemm_avx2.cpp and quant_rows.cpp.
// The layout itself is described at the top of quant_gemm.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <cpuid.h>
#include <immintrin.h>

#include <cstdint>

namespace sarathi_kernels {

constexpr int kCols = 16;           // output columns per tile
constexpr int kGroup = 32;          // input positions per code group
constexpr int kQuads = kGroup / 4;  // 4-position quads per group
constexpr int kFineShift = 8;       // x's second int8 term has 2^8 steps per step of its first
constexpr int kFine = 1 << kFineShift;

// IQ4_NL's and IQ4_XS's codes: 4-bit indices into a table of 16 int8 values (kIq4Values), laid out as 4-bit
// codes are and turned into the values by a byte shuffle where they are read. Passed as a code width (`bits`),
// it names the code kind to every kernel; kernels that multiply bytes treat the looked-up values as they do
// 8-bit codes (byte_valued).
constexpr int kIq4Codes = 40;
// ggml's kvalues_iq4nl (the `gguf` package's IQ4_NL.kvalues: tests/model/test_quantized.py compares the kernels
// against its dequantization)
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

constexpr bool byte_valued(int bits) { return bits == 8 || bits == kIq4Codes; }
constexpr bool known_code_kind(int64_t bits) {
  return (bits >= 2 && bits <= 6) || bits == 8 || bits == kIq4Codes;
}

// 2- to 6-bit codes: 256 bytes of 4-bit codes or 128 of 2-bit ones, and a 64-byte plane per bit past them
constexpr int group_bytes(int bits) { return bits == 8 ? 512 : bits == kIq4Codes ? 256 : bits < 4 ? 128 + (bits - 2) * 64 : 256 + (bits - 4) * 64; }

// Whether this is an Intel CPU, where code streams are prefetched into L2 rather than non-temporally
// (prefetch_codes).
inline bool intel_cpu() {
  static const bool intel = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547;  // "Genu"ineIntel
  }();
  return intel;
}

// Prefetches the cache lines of the `bytes` codes that lie `ahead` bytes past `codes` (a prefetch never faults, so
// past the weight's end is harmless). On AMD CPUs non-temporally: codes are read once a step, and a step's ~800 MB
// streamed in the usual way evicted what the next kernels need (1B Q4_K_M decode 0.965x the time, Zen5; the T1 hint
// there 1.03x at 1 and 2 sequences, benchmarks/kernel_ab). On Intel CPUs into L2 (T1): on a 2-core Xeon (family 6
// model 167) the non-temporal hint made one row of x over Llama 3.2 1B's MLP weights from memory slower than no
// prefetch at all, at every kernel level: Q4_K / Q6_K 1.65 / 2.25 ms against 0.54 / 0.83 ms with T1 ("full"), 1.60
// / 2.17 against 0.60 / 0.77 ("vnni"), 1.58 / 1.98 against 0.67 / 0.93 ("avx2"); without prefetching 1.02 / 1.49
// ("full").
// `intel` is intel_cpu(), read once by a caller's loop (its guarded static is re-checked at every call).
inline void prefetch_codes(const uint8_t* codes, int64_t bytes, int64_t ahead, bool intel) {
  const char* p = reinterpret_cast<const char*>(codes) + ahead;
  if (intel) {
#pragma GCC unroll 8
    for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_T1);
  } else {
#pragma GCC unroll 8
    for (int64_t line = 0; line < bytes; line += 64) _mm_prefetch(p + line, _MM_HINT_NTA);
  }
}

// Sub-blocks per scale d: k-quants' 256-weight super-blocks, or one (a compile-time constant: a division per
// sub-block in the inner loops cost a quarter of the one-row time).
template <int SUB, bool SC>
constexpr int64_t kSubsPerSuper = SC ? 256 / SUB : 1;

struct Weight {
  const uint8_t* codes;
  const uint16_t* d;
  const int8_t* sc;
  const uint16_t* dm;
  const uint8_t* mc;
  int64_t groups, subs, supers;  // per tile
  int bits, zero;
};

// x rows in two int8 terms per 32 positions: x ~ dx * (q1 + q2 / 256), dx = max|x| / 127,
// q1 = round(x / dx), q2 = round((x / dx - q1) * 256) held to +-127 (256 rather than 254: the kernels join the
// terms with a shift, not a multiply). The second term carries the first one's rounding
// error, so the pair resolves x to max|x| / 32,512 (16 bits): the bf16 path's precision or better, where one
// int8 term alone (llama.cpp's Q8_0 activations) misses our logits contract (see docs/results.md).
// Per sub-block: the sum of 256 * q1 + q2 (for the zero point) and of the float32 x (for the offset term).
struct QuantizedRows {
  const int8_t* q1;
  const int8_t* q2;
  const float* dx;      // [m, k / 32]: max|x| / (127 * 256), the scale of 256 * q1 + q2
  const int32_t* isum;  // [m, k / sub]
  const float* xsum;    // [m, k / sub]
  int64_t k, sub;
  const int16_t* x16 = nullptr;  // [m, k]: 256 * q1 + q2, where a kernel multiplies the terms joined

  QuantizedRows rows_from(int64_t r) const {
    const int64_t nsub = k / sub;
    return {q1 + r * k, q2 + r * k, dx + r * (k / kGroup), isum + r * nsub, xsum + r * nsub, k, sub,
            x16 == nullptr ? nullptr : x16 + r * k};
  }
};

// Calls f.template operator()<BITS, SUB, SC, MIN>() with the kernel parameters of a format key (bits * 1000 +
// sub-block size * 10 + 2 if sub-block scales + 1 if offsets); false for a key no kernel serves.
template <typename F>
bool with_format(int key, F&& f) {
  switch (key) {
    case 4320: f.template operator()<4, 32, false, false>(); return true;  // Q4_0
    case 4321: f.template operator()<4, 32, false, true>(); return true;   // Q4_1
    case 3162: f.template operator()<3, 16, true, false>(); return true;   // Q3_K
    case 2163: f.template operator()<2, 16, true, true>(); return true;    // Q2_K
    case 5320: f.template operator()<5, 32, false, false>(); return true;  // Q5_0
    case 5321: f.template operator()<5, 32, false, true>(); return true;   // Q5_1
    case 8320: f.template operator()<8, 32, false, false>(); return true;  // Q8_0
    case 40320: f.template operator()<kIq4Codes, 32, false, false>(); return true;  // IQ4_NL
    case 40322: f.template operator()<kIq4Codes, 32, true, false>(); return true;   // IQ4_XS
    case 4323: f.template operator()<4, 32, true, true>(); return true;    // Q4_K
    case 5323: f.template operator()<5, 32, true, true>(); return true;    // Q5_K
    case 6162: f.template operator()<6, 16, true, false>(); return true;   // Q6_K
    default: return false;
  }
}

// Whether this CPU runs the AVX2 builds (AVX2, FMA, F16C): the kernels' path where AVX-512 with BF16 and VNNI
// is missing.
bool cpu_supports_avx2();

// Rows of x up to which the AVX2 path multiplies x in int8 terms (more: float32 x), by code width.
int64_t int8_up_to_rows_avx2(int64_t bits);

// out[M, n] (float32, row stride ldy) = x (float32 or bf16 [M, K], unit column stride) @ W^T on the AVX2
// path; `key` names the format as in quant_gemm.cpp (bits * 1000 + sub * 10 + 2 * sc + min); up to int8_rows
// rows of x take the int8 path.
void quant_gemm_avx2(const at::Tensor& x, const Weight& w, int key, int64_t sub, float* y, int64_t ldy, int64_t n,
                     int64_t int8_rows);

}  // namespace sarathi_kernels
