// Row-wise argmax for greedy sampling on CPUs: each row's first maximum, as torch.argmax.
// One vectorized pass takes the maximum of each chunk of the row; then only the first chunk
// holding the row's maximum is scanned for its index. bfloat16 widens to float32 exactly, so
// the choice is the one the widened row would give.

#include <algorithm>
#include <cstdint>

#include "cpu_bf16.h"
#include "cpu_device.h"

namespace {

constexpr int64_t kChunk = 512;

template <typename T>
inline float widen(const T* row, int64_t i) {
  return static_cast<float>(row[i]);
}

template <>
inline float widen(const c10::BFloat16* row, int64_t i) {
  return argosy_bf16::widen(reinterpret_cast<const uint16_t*>(row)[i]);
}

// The maximum of row[begin, end), begin < end.
template <typename T>
float chunk_max(const T* row, int64_t begin, int64_t end) {
  float best = widen(row, begin);
  for (int64_t i = begin + 1; i < end; ++i) best = std::max(best, widen(row, i));
  return best;
}

#if defined(__AVX512F__)
template <>
float chunk_max(const c10::BFloat16* row, int64_t begin, int64_t end) {
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(row);
  int64_t i = begin;
  float best = widen(row, begin);
  if (end - begin >= 32) {
    __m512 a = _mm512_set1_ps(best), b = a;
    for (; i + 32 <= end; i += 32) {
      a = _mm512_max_ps(a, argosy_bf16::load16(bits + i));
      b = _mm512_max_ps(b, argosy_bf16::load16(bits + i + 16));
    }
    best = _mm512_reduce_max_ps(_mm512_max_ps(a, b));
  }
  for (; i < end; ++i) best = std::max(best, widen(row, i));
  return best;
}
#endif

template <typename T>
int64_t row_argmax(const T* row, int64_t n) {
  float best = chunk_max(row, 0, std::min(n, kChunk));
  int64_t best_chunk = 0;
  for (int64_t c = kChunk; c < n; c += kChunk) {
    const float m = chunk_max(row, c, std::min(n, c + kChunk));
    if (m > best) best = m, best_chunk = c;
  }
  const int64_t end = std::min(n, best_chunk + kChunk);
  for (int64_t i = best_chunk; i < end; ++i)
    if (widen(row, i) == best) return i;
  return best_chunk;  // not reached: the chunk holds its own maximum
}

}  // namespace

// logits: [rows, vocab], each row contiguous. Returns int64 [rows].
at::Tensor greedy_argmax(const at::Tensor& logits) {
  check_on_cpu("greedy_argmax", logits);
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.stride(1) == 1,
              "logits must be [rows, vocab] with contiguous rows");
  const int64_t rows = logits.size(0), vocab = logits.size(1), stride = logits.stride(0);
  at::Tensor out = cpu_empty({rows}, logits.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, logits.scalar_type(), "greedy_argmax", [&] {
    const scalar_t* lp = logits.data_ptr<scalar_t>();
    at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) op[r] = row_argmax(lp + r * stride, vocab);
    });
  });
  return out;
}
