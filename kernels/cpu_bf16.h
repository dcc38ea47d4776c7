// bfloat16 <-> float32 for the CPU kernels, one at a time and 16 at a time. A bfloat16 is the
// top half of a float32: widening is exact (shift left by 16); narrowing rounds to nearest
// even, as PyTorch's conversion does.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace argosy_bf16 {

inline float widen(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t narrow(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

inline float round_bf16(float f) { return widen(narrow(f)); }

#if defined(__AVX512F__)
inline __m512 load16(const uint16_t* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 round16(__m512 f) {  // to the nearest bfloat16, still as float32
  const __m512i u = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_castsi512_ps(_mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

inline void store16(uint16_t* p, __m512 rounded) {  // rounded: what round16 gave
  const __m512i top = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(top));
}
#endif

}  // namespace argosy_bf16
