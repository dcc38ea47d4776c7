// Vector math the CPU attention kernels share, 16 float32 lanes at a time (AVX-512).
#pragma once

#if defined(__AVX512F__)
#include <immintrin.h>

namespace argosy_vec {

// 2^x for 16 floats: x = n + f with f in [-0.5, 0.5], 2^f by its Taylor series to the 5th
// power (relative error under 3e-6, far below bfloat16's 4e-3, which P is rounded to), scaled by
// 2^n exactly. Below -200 the result is 0: a masked key (-inf) weighs exactly nothing.
inline __m512 exp2_16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  // (ln 2)^k / k!
  __m512 p = _mm512_set1_ps(1.3333558146428443e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.2402265069591007f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471805599453f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// Lane j of the result: the sum of v[j]'s 16 lanes, as four rounds of pairwise adds of shuffled
// halves (45 instructions where 16 separate reductions take about 130).
inline __m512 sum16(const __m512 v[16]) {
  __m512 w[8], x[4], y[2];
  for (int i = 0; i < 8; ++i)  // lanes of 128 bits: (v[2i], v[2i+1]) interleaved, each a 2-lane sum
    w[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // 128-bit lane: sums of v[4i .. 4i+3] over that lane's 4 floats
    const __m512d a = _mm512_castps_pd(w[2 * i]), b = _mm512_castps_pd(w[2 * i + 1]);
    x[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int i = 0; i < 2; ++i)  // 128-bit lanes of x[2i] and x[2i+1] paired up
    y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0x88), _mm512_shuffle_f32x4(x[2 * i], x[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y[0], y[1], 0x88), _mm512_shuffle_f32x4(y[0], y[1], 0xDD));
}

}  // namespace argosy_vec
#endif
