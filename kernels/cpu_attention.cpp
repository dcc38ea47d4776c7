// Paged decode attention for CPUs: one query token per sequence, its keys and values read in
// place from the paged cache through the block table (no gathered copy), float32 arithmetic
// whatever the cache's dtype. One task per (sequence, KV head): the GQA group's query heads
// share every key and value row they read. The PyTorch reference is paged_attention.py.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_bf16.h"
#include "cpu_vector_math.h"
#include "cpu_device.h"

namespace {

// D: the head dimension, fixed at compile time for the common sizes so that every loop over it
// unrolls into vector instructions; 0 reads it at run time.
template <typename T, int64_t D>
void decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& q_index, const at::Tensor& block_tables, const at::Tensor& seq_lens,
            double scale, at::Tensor& out) {
  const int64_t num_seqs = q_index.size(0), num_heads = q.size(1);
  const int64_t head_dim = D ? D : q.size(2);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = num_heads / kv_heads, max_blocks = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  const int64_t* rows = q_index.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t token_stride = kv_heads * head_dim;  // between consecutive slots of the cache
  const int64_t block_stride = block_size * token_stride;

  at::parallel_for(0, num_seqs * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(group * head_dim), row(head_dim), acc(group * head_dim), scores, total(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t seq = task / kv_heads, head = task % kv_heads, len = lens[seq];
      const int64_t num_blocks = (len + block_size - 1) / block_size;
      const T* q_row = qp + (rows[seq] * num_heads + head * group) * head_dim;
      for (int64_t i = 0; i < group * head_dim; ++i) query[i] = static_cast<float>(q_row[i]) * scale;
      scores.resize(group * len);
      const int64_t* table = tables + seq * max_blocks;
      // Calls visit(t) with `row` holding slot t's vector (of `cache`, this head) in float32.
      auto for_each_slot = [&](const T* cache, auto visit) {
        for (int64_t b = 0; b < num_blocks; ++b) {
          const T* block = cache + table[b] * block_stride + head * head_dim;
          const int64_t first = b * block_size, last = std::min(len, first + block_size);
          for (int64_t t = first; t < last; ++t) {
            const T* slot = block + (t - first) * token_stride;
            for (int64_t d = 0; d < head_dim; ++d) row[d] = static_cast<float>(slot[d]);
            visit(t);
          }
        }
      };
      for_each_slot(kp, [&](int64_t t) {
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = query.data() + g * head_dim;
          float dot = 0.f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qg[d] * row[d];
          scores[g * len + t] = dot;
        }
      });
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * len;
        total[g] = argosy_vec::exp_sum(s, len, *std::max_element(s, s + len));
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for_each_slot(vp, [&](int64_t t) {
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + t];
          float* a = acc.data() + g * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] += p * row[d];
        }
      });
      T* o_row = op + (rows[seq] * num_heads + head * group) * head_dim;
      for (int64_t g = 0; g < group; ++g) {
        const float inv = 1.f / total[g];
        for (int64_t d = 0; d < head_dim; ++d) o_row[g * head_dim + d] = static_cast<T>(acc[g * head_dim + d] * inv);
      }
    }
  });
}

#if defined(__AVX512BF16__)
// 2^(s - max s) over n floats in place; returns their sum.
inline float exp2_sum(float* s, int64_t n) {
  __m512 peak = _mm512_set1_ps(-std::numeric_limits<float>::infinity()), sum = _mm512_setzero_ps();
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 lanes = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    peak = _mm512_mask_max_ps(peak, lanes, peak, _mm512_maskz_loadu_ps(lanes, s + t));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(peak));
  for (int64_t t = 0; t < n; t += 16) {
    const __mmask16 lanes = n - t >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - t)) - 1);
    const __m512 p = argosy_vec::exp2_16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, s + t), top));
    _mm512_mask_storeu_ps(s + t, lanes, p);
    sum = _mm512_mask_add_ps(sum, lanes, sum, p);
  }
  return _mm512_reduce_add_ps(sum);
}

// The same for bfloat16 on CPUs with AVX512-BF16, one task per sequence: each cache row (every KV
// head of one token, contiguous) is read in order, for all the query heads; q . k in `dpbf16`
// (bfloat16 pairs multiplied exactly, summed in float32) for 16 keys at a time, their sums
// reduced together; softmax in float32 (2^x by exp2_16), p * v in float32 after widening v.
// Reading whole rows in order lets the hardware prefetcher stream the blocks, which is what
// bounds this kernel once the cache outgrows the processor's caches.
template <int64_t D>
void decode_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& q_index, const at::Tensor& block_tables, const at::Tensor& seq_lens,
                 double scale, at::Tensor& out) {
  static_assert(D % 32 == 0, "whole vectors of bfloat16 pairs");
  constexpr int64_t kPairs = D / 32, kFloats = D / 16, kAhead = 4;
  const int64_t num_seqs = q_index.size(0), num_heads = q.size(1);
  const int64_t block_size = k_cache.size(1), kv_heads = k_cache.size(2);
  const int64_t group = num_heads / kv_heads, max_blocks = block_tables.size(1);
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  const int64_t* rows = q_index.data_ptr<int64_t>();
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const int64_t token_stride = kv_heads * D, block_stride = block_size * token_stride;
  const float scale2 = static_cast<float>(scale * M_LOG2E);  // scores in base 2: exp(x) = 2^(x log2 e)
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, inv(num_heads);
    std::vector<__m512> acc(num_heads * kFloats);  // each query head's output, in float32
    for (int64_t seq = begin; seq < end; ++seq) {
      const int64_t len = lens[seq];
      const int64_t* table = tables + seq * max_blocks;
      scores.resize(num_heads * len);
      const uint16_t* q_row = qp + rows[seq] * num_heads * D;
      // Rows a few slots ahead are fetched early: across a jump to the next block, which the
      // hardware prefetcher cannot foresee, this keeps the stream going.
      auto for_each_slot = [&](const uint16_t* cache, auto visit) {
        for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
          const uint16_t* slot = cache + table[b] * block_stride;
          const uint16_t* next = first + block_size < len ? cache + table[b + 1] * block_stride : nullptr;
          const int64_t last = std::min(len, first + block_size);
          for (int64_t t = first; t < last; ++t, slot += token_stride) {
            const int64_t ahead = t - first + kAhead;
            const uint16_t* row = ahead < block_size ? slot + kAhead * token_stride
                                  : next            ? next + (ahead - block_size) * token_stride
                                                    : nullptr;
            if (row)
              for (int64_t byte = 0; byte < 2 * token_stride; byte += 64)
                _mm_prefetch(reinterpret_cast<const char*>(row) + byte, _MM_HINT_T0);
            visit(t, slot);
          }
        }
      };
      // q . k for up to 16 keys of one block at a time, their 16 sums reduced together.
      for (int64_t first = 0, b = 0; first < len; first += block_size, ++b) {
        const uint16_t* block = kp + table[b] * block_stride;
        if (first + block_size < len)
          _mm_prefetch(reinterpret_cast<const char*>(kp + table[b + 1] * block_stride), _MM_HINT_T0);
        for (int64_t t0 = first; t0 < std::min(len, first + block_size); t0 += 16) {
          const int64_t count = std::min<int64_t>({16, len - t0, first + block_size - t0});
          const uint16_t* keys = block + (t0 - first) * token_stride;
          for (int64_t hg = 0; hg < num_heads; ++hg) {
            const uint16_t* kh = keys + (hg / group) * D;
            __m512bh query[kPairs];
            for (int64_t i = 0; i < kPairs; ++i) query[i] = (__m512bh)_mm512_loadu_si512(q_row + hg * D + 32 * i);
            __m512 dots[16];
            for (int64_t j = 0; j < 16; ++j) {
              dots[j] = _mm512_setzero_ps();
              if (j < count)
                for (int64_t i = 0; i < kPairs; ++i)
                  dots[j] = _mm512_dpbf16_ps(dots[j], query[i], (__m512bh)_mm512_loadu_si512(kh + j * token_stride + 32 * i));
            }
            _mm512_mask_storeu_ps(scores.data() + hg * len + t0, static_cast<__mmask16>((1u << count) - 1),
                                  _mm512_mul_ps(argosy_vec::sum16(dots), _mm512_set1_ps(scale2)));
          }
        }
      }
      for (int64_t hg = 0; hg < num_heads; ++hg) inv[hg] = 1.f / exp2_sum(scores.data() + hg * len, len);
      for (auto& a : acc) a = _mm512_setzero_ps();
      for_each_slot(vp, [&](int64_t t, const uint16_t* vrow) {
        for (int64_t h = 0; h < kv_heads; ++h) {
          __m512 wide[kFloats];
          for (int64_t i = 0; i < kFloats; ++i) wide[i] = argosy_bf16::load16(vrow + h * D + 16 * i);
          for (int64_t g = 0; g < group; ++g) {
            const int64_t hg = h * group + g;
            const __m512 p = _mm512_set1_ps(scores[hg * len + t]);
            __m512* a = acc.data() + hg * kFloats;
            for (int64_t i = 0; i < kFloats; ++i) a[i] = _mm512_fmadd_ps(p, wide[i], a[i]);
          }
        }
      });
      for (int64_t hg = 0; hg < num_heads; ++hg)
        for (int64_t i = 0; i < kFloats; ++i) {
          const __m256bh narrow = _mm512_cvtneps_pbh(_mm512_mul_ps(acc[hg * kFloats + i], _mm512_set1_ps(inv[hg])));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(op + (rows[seq] * num_heads + hg) * D + 16 * i), (__m256i)narrow);
        }
    }
  });
}
#endif

}  // namespace

// q, out: [tokens, heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim];
// q_index, seq_lens: [decodes]; block_tables: [decodes, max_blocks]. Writes out[q_index].
void paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                            const at::Tensor& q_index, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale, at::Tensor& out) {
  check_on_cpu("paged_decode_attention", q, k_cache, v_cache, q_index, block_tables, seq_lens, out);
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous(), "q and out must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(q_index.scalar_type() == at::kLong && block_tables.scalar_type() == at::kLong &&
                  seq_lens.scalar_type() == at::kLong,
              "indices must be int64");
  TORCH_CHECK(block_tables.is_contiguous(), "block_tables must be contiguous");
#if defined(__AVX512BF16__)
  if (q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16) {
    if (q.size(2) == 64) return decode_bf16<64>(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out);
    if (q.size(2) == 128) return decode_bf16<128>(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out);
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_decode_attention", [&] {
    switch (q.size(2)) {
      case 64: return decode<scalar_t, 64>(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out);
      case 128: return decode<scalar_t, 128>(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out);
      default: return decode<scalar_t, 0>(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out);
    }
  });
}
