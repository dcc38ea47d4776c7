// Vector math the CPU attention kernels share: 2^x 16 (AVX-512) or 8 (AVX2) float32 lanes at a
// time, softmax's exponentials over a row of scores at every level, and 16 sums at once.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace argosy_vec {

// 2^f for f in [-0.5, 0.5] by its Taylor series to the 5th power (relative error under 3e-6, far
// below bfloat16's 4e-3, which P is rounded to): coefficients (ln 2)^k / k!, highest first.
constexpr float kExp2Poly[6] = {1.3333558146428443e-3f, 9.618129107628477e-3f, 5.550410866482158e-2f,
                                0.2402265069591007f,    0.6931471805599453f,   1.f};
constexpr float kLog2e = 1.4426950408889634f;

#if defined(__AVX512F__)
// 2^x for 16 floats: x = n + f, 2^f by the series, scaled by 2^n exactly. Below -200 the result
// is 0: a masked key (-inf) weighs exactly nothing.
inline __m512 exp2_16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-200.f));
  const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
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
#elif defined(__AVX2__)
// 2^x for 8 floats, as exp2_16 does it; 2^n built in the exponent field. Below -126 (where 2^n
// would leave the normal range) the result is 0.
inline __m256 exp2_8(__m256 x) {
  const __m256 live = _mm256_cmp_ps(x, _mm256_set1_ps(-126.f), _CMP_GE_OQ);
  x = _mm256_max_ps(x, _mm256_set1_ps(-126.f));
  const __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(x, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(bits)), live);
}
#endif

// s[i] = e^(s[i] - peak) for n scores in place (peak at least their maximum); returns their sum.
inline float exp_sum(float* s, int64_t n, float peak) {
  int64_t i = 0;
  float sum = 0.f;
#if defined(__AVX512F__)
  const __m512 shift = _mm512_set1_ps(peak * kLog2e), log2e = _mm512_set1_ps(kLog2e);
  __m512 total = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    const __m512 p = exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(s + i), log2e, shift));
    _mm512_storeu_ps(s + i, p);
    total = _mm512_add_ps(total, p);
  }
  sum = _mm512_reduce_add_ps(total);
#elif defined(__AVX2__)
  const __m256 shift = _mm256_set1_ps(peak * kLog2e), log2e = _mm256_set1_ps(kLog2e);
  __m256 total = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 p = exp2_8(_mm256_fmsub_ps(_mm256_loadu_ps(s + i), log2e, shift));
    _mm256_storeu_ps(s + i, p);
    total = _mm256_add_ps(total, p);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  for (float lane : lanes) sum += lane;
#endif
  for (; i < n; ++i) sum += (s[i] = std::exp(s[i] - peak));
  return sum;
}

}  // namespace argosy_vec
