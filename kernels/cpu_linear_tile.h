// The tiled product behind the CPU linear layers (cpu_linear.cpp: bfloat16 weights in pairs of
// inputs; cpu_linear_int8.cpp: int8 weights with a scale per output), over units of 16 output
// features, each unit one contiguous stream of lines: a line is what one step of the product
// multiplies (16 features' pair of inputs, or one input). Several units are read at once, so one
// row of x keeps independent sums going, each prefetched ~2 KiB ahead; several rows of x share
// each line read. A format says how a line is loaded and multiplied; every output row is summed
// over the lines in order whatever the number of rows, so a row's result does not depend on the
// rows beside it (a speculative step's verification rows must equal the decode steps they stand for).
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_bf16.h"
#include "cpu_device.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace argosy_linear {

constexpr int64_t kUnit = 16;          // output features per unit
constexpr int64_t kAheadBytes = 2048;  // how far ahead a unit's stream is prefetched

// A unit's 16 float32 sums, in the level's registers.
#if defined(__AVX512F__)
using Sum = __m512;
constexpr int kSums = 1;
#elif defined(__AVX2__)
using Sum = __m256;  // 8 of the 16
constexpr int kSums = 2;
#else
struct Sum {
  float f[kUnit];
};
constexpr int kSums = 1;
#endif

inline void prefetch(const void* p) {
#if defined(__AVX2__)
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
#else
  __builtin_prefetch(p);
#endif
}

// The unit's sums, times each feature's scale (when there are scales) plus its bias, as bfloat16:
// rounded after the product and again after the sum, never fused into one multiply-add (which
// -ffast-math would allow), so that the result is the one a reference computes step by step.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
inline void store_unit(const Sum* acc, const float* scale, const uint16_t* bias, uint16_t* out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
#if defined(__AVX512F__)
  __m512 sum = acc[0];
  if (scale != nullptr) sum = _mm512_mul_ps(sum, _mm512_loadu_ps(scale));
  if (bias != nullptr) sum = _mm512_add_ps(sum, argosy_bf16::load16(bias));
  argosy_bf16::store16(out, argosy_bf16::round16(sum));
#else
  float sums[kUnit];
  std::memcpy(sums, acc, sizeof sums);  // the unit's 16 sums, in feature order
  for (int64_t f = 0; f < kUnit; ++f) {
    float s = scale == nullptr ? sums[f] : sums[f] * scale[f];
    if (bias != nullptr) s += argosy_bf16::widen(bias[f]);
    out[f] = argosy_bf16::narrow(s);
  }
#endif
}

// What one call multiplies: `steps` lines per unit of the weight, a unit's stream
// `unit_stride` weight elements long.
template <typename Format>
struct Operands {
  const typename Format::XElem* x;
  int64_t x_stride;
  const typename Format::Weight* w;
  int64_t unit_stride, steps;
  const float* scale;  // per output feature, or nullptr
  const uint16_t* bias;
  uint16_t* out;
  int64_t out_stride;
};

// Sums ROWS rows of x against UNITS units, then writes them.
template <typename Format, int UNITS, int ROWS>
void tile(const Operands<Format>& o) {
  constexpr int64_t line_bytes = Format::kLineElems * sizeof(typename Format::Weight);
  constexpr int64_t ahead = kAheadBytes / line_bytes, lines_per_cache_line = std::max<int64_t>(1, 64 / line_bytes);
  Sum acc[ROWS][UNITS][kSums] = {};
  for (int64_t p = 0; p < o.steps; ++p) {
    typename Format::Line lines[UNITS];
    for (int u = 0; u < UNITS; ++u) {
      const typename Format::Weight* line = o.w + u * o.unit_stride + p * Format::kLineElems;
      if (p % lines_per_cache_line == 0) prefetch(line + ahead * Format::kLineElems);
      lines[u] = Format::load(line);
    }
    for (int r = 0; r < ROWS; ++r) {
      const typename Format::XVal xs = Format::x_at(o.x + r * o.x_stride, p);
      for (int u = 0; u < UNITS; ++u) Format::add(acc[r][u], lines[u], xs);
    }
  }
  for (int r = 0; r < ROWS; ++r)
    for (int u = 0; u < UNITS; ++u)
      store_unit(acc[r][u], o.scale == nullptr ? nullptr : o.scale + u * kUnit,
                 o.bias == nullptr ? nullptr : o.bias + u * kUnit, o.out + r * o.out_stride + u * kUnit);
}

template <typename Format, int UNITS, int ROWS = Format::kRows>
void tile_rows(int rows, const Operands<Format>& o) {
  if constexpr (ROWS > 1) {
    if (rows < ROWS) return tile_rows<Format, UNITS, ROWS - 1>(rows, o);
  }
  tile<Format, UNITS, ROWS>(o);
}

template <typename Format, int UNITS = std::max(Format::kUnits, Format::kOneRowUnits)>
void tile_any(int units, int rows, const Operands<Format>& o) {
  if constexpr (UNITS > 1) {
    if (units < UNITS) return tile_any<Format, UNITS - 1>(units, rows, o);
  }
  tile_rows<Format, UNITS>(rows, o);
}

// out [m, n] = x [m, ...] times every unit, the units split evenly over the threads; within a
// thread, a few units at a time over every row. `whole` holds the first unit's operands.
template <typename Format>
void product(int64_t m, int64_t n, const Operands<Format>& whole) {
  if (m == 0) return;  // a step of no logits rows: no passes to share rows between
  const int64_t units = n / kUnit;
  const int64_t unit_step = m == 1 ? Format::kOneRowUnits : Format::kUnits;
  // As few passes over the weights as the tile's rows allow, the rows shared evenly between them
  // (16 rows in tiles of at most 5: four passes of 4, not three of 5 and one of 1).
  const int64_t passes = (m + Format::kRows - 1) / Format::kRows, pass_rows = (m + passes - 1) / passes;
  at::parallel_for(0, units, 1, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; u += unit_step) {
      const int width = static_cast<int>(std::min<int64_t>(unit_step, end - u));
      for (int64_t r = 0; r < m; r += pass_rows) {
        Operands<Format> part = whole;
        part.x += r * whole.x_stride;
        part.w += u * whole.unit_stride;
        part.scale = whole.scale == nullptr ? nullptr : whole.scale + u * kUnit;
        part.bias = whole.bias == nullptr ? nullptr : whole.bias + u * kUnit;
        part.out += r * whole.out_stride + u * kUnit;
        tile_any<Format>(width, static_cast<int>(std::min(pass_rows, m - r)), part);
      }
    }
  });
}

// Rows of bfloat16 x as float32, contiguous: for the formats that multiply widened x.
inline std::vector<float> widened_rows(const uint16_t* x, int64_t m, int64_t k, int64_t x_stride) {
  std::vector<float> widened(m * k);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) widened[r * k + i] = argosy_bf16::widen(x[r * x_stride + i]);
  return widened;
}

// The bias of a linear product, checked: [n] bfloat16, or nullptr.
inline const uint16_t* bias_data(const char* kernel, const c10::optional<at::Tensor>& bias, int64_t n) {
  if (!bias.has_value()) return nullptr;
  check_on_cpu(kernel, *bias);
  TORCH_CHECK(bias->is_contiguous() && bias->numel() == n && bias->scalar_type() == at::kBFloat16, "bias: [out]");
  return reinterpret_cast<const uint16_t*>(bias->data_ptr());
}

}  // namespace argosy_linear
