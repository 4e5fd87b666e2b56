// Vector math shared by the kernels. Include it after the file's `#pragma GCC target(...)` (AVX-512).
#pragma once

#include <immintrin.h>

namespace sarathi_kernels::vec {

// e^x for any float x, clamped to where float32 neither overflows nor fully underflows: 2^(x log2 e) split
// into 2^n * 2^f, f in [-0.5, 0.5], 2^f by a degree-6 polynomial (relative error < 2e-7).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.5353362e-4f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3398874e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace sarathi_kernels::vec
