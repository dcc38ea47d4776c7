// Paged attention for query chunks on CPUs. A chunk is consecutive new tokens of one sequence (a
// prompt chunk, a chunk continuing a cached prefix, the positions a speculative step verifies);
// each attends causally to every key before it, read in place from the paged cache through the
// block table. Flash-style: a task takes a tile of query rows (query tokens x the GQA group's
// heads) of one KV head and walks the keys 16 at a time with an online softmax, so no score
// matrix of the whole context is ever held. The PyTorch reference is paged_attention.py's tiles.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cpu_bf16.h"
#include "cpu_vector_math.h"
#include "cpu_device.h"

namespace {

constexpr int64_t kKeys = 16;      // keys per step of the walk: one float32 vector's lanes
constexpr int64_t kTileRows = 128;  // query rows per task
constexpr float kNoScore = -std::numeric_limits<float>::infinity();
constexpr float kStartMax = -1e30f;  // finite: a row with no key yet never computes inf - inf

struct Chunks {
  const int64_t* q_start;  // first token of each chunk in the flattened batch
  const int64_t* q_len;
  const int64_t* seq_len;  // keys in the cache after this step, the chunk's own included
  const int64_t* tables;   // [chunks, max_blocks]
  int64_t max_blocks;
};

struct Task {
  int64_t chunk, head, row0;  // rows row0.. of the chunk's q_len * group rows, of KV head `head`
};

std::vector<Task> plan_tasks(const Chunks& c, int64_t num_chunks, int64_t kv_heads, int64_t group) {
  std::vector<Task> tasks;
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk)
    for (int64_t head = 0; head < kv_heads; ++head)
      for (int64_t row0 = 0; row0 < c.q_len[chunk] * group; row0 += kTileRows) tasks.push_back({chunk, head, row0});
  return tasks;
}

// Where one task's rows sit: row r is query token (row0 + r) / group of the chunk, query head
// head * group + (row0 + r) % group.
struct TaskRows {
  int64_t row0, rows, context, first_token, keys, group;  // keys: how many its last row sees

  TaskRows(const Chunks& c, const Task& t, int64_t group) : row0(t.row0), group(group) {
    const int64_t len = c.q_len[t.chunk];
    rows = std::min(kTileRows, len * group - t.row0);
    context = c.seq_len[t.chunk] - len;  // keys before the chunk
    first_token = c.q_start[t.chunk];
    keys = position(rows - 1) + 1;
  }
  int64_t position(int64_t r) const { return context + (row0 + r) / group; }
  int64_t offset(int64_t r, int64_t head, int64_t num_heads, int64_t head_dim) const {  // in q and out
    const int64_t token = first_token + (row0 + r) / group;
    return (token * num_heads + head * group + (row0 + r) % group) * head_dim;
  }
};

// The tensors every path reads, with the cache's strides.
struct Layout {
  int64_t num_heads, head_dim, block_size, kv_heads, group, token_stride, block_stride;

  explicit Layout(const at::Tensor& q, const at::Tensor& k_cache)
      : num_heads(q.size(1)), head_dim(q.size(2)), block_size(k_cache.size(1)), kv_heads(k_cache.size(2)) {
    group = num_heads / kv_heads;
    token_stride = kv_heads * head_dim;
    block_stride = block_size * token_stride;
  }
  template <typename T>
  const T* row(const T* cache, const Chunks& c, int64_t chunk, int64_t key, int64_t head) const {
    const int64_t block = c.tables[chunk * c.max_blocks + key / block_size];
    return cache + block * block_stride + (key % block_size) * token_stride + head * head_dim;
  }
};

// Any dtype, float32 arithmetic: a row at a time against each step's 16 keys.
template <typename T, int64_t D>
void chunks_generic(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const Chunks& c,
                    int64_t num_chunks, double scale, at::Tensor& out) {
  const Layout L(q, k_cache);
  const int64_t head_dim = D ? D : L.head_dim;
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const std::vector<Task> tasks = plan_tasks(c, num_chunks, L.kv_heads, L.group);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(kTileRows * head_dim), acc(kTileRows * head_dim), keys(kKeys * head_dim),
        values(kKeys * head_dim), top(kTileRows), total(kTileRows);
    for (int64_t i = begin; i < end; ++i) {
      const Task& t = tasks[i];
      const TaskRows tile(c, t, L.group);
      for (int64_t r = 0; r < tile.rows; ++r) {
        const T* src = qp + tile.offset(r, t.head, L.num_heads, head_dim);
        for (int64_t d = 0; d < head_dim; ++d) query[r * head_dim + d] = static_cast<float>(src[d]) * float(scale);
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(top.begin(), top.end(), kStartMax);
      std::fill(total.begin(), total.end(), 0.f);
      for (int64_t k0 = 0; k0 < tile.keys; k0 += kKeys) {
        const int64_t n = std::min(kKeys, tile.keys - k0);
        for (int64_t j = 0; j < n; ++j) {
          const T* k_row = L.row(kp, c, t.chunk, k0 + j, t.head);
          const T* v_row = L.row(vp, c, t.chunk, k0 + j, t.head);
          for (int64_t d = 0; d < head_dim; ++d) {
            keys[j * head_dim + d] = static_cast<float>(k_row[d]);
            values[j * head_dim + d] = static_cast<float>(v_row[d]);
          }
        }
        for (int64_t r = 0; r < tile.rows; ++r) {
          const int64_t seen = std::min(n, tile.position(r) - k0 + 1);  // causal: keys up to its own
          if (seen <= 0) continue;
          float scores[kKeys], peak = top[r];
          const float* qr = query.data() + r * head_dim;
          for (int64_t j = 0; j < seen; ++j) {
            float dot = 0.f;
            for (int64_t d = 0; d < head_dim; ++d) dot += qr[d] * keys[j * head_dim + d];
            scores[j] = dot;
            peak = std::max(peak, dot);
          }
          const float correction = std::exp(top[r] - peak);
          float* a = acc.data() + r * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) a[d] *= correction;
          const float sum = argosy_vec::exp_sum(scores, seen, peak);  // the step's exponentials at once
          for (int64_t j = 0; j < seen; ++j)
            for (int64_t d = 0; d < head_dim; ++d) a[d] += scores[j] * values[j * head_dim + d];
          total[r] = total[r] * correction + sum;
          top[r] = peak;
        }
      }
      for (int64_t r = 0; r < tile.rows; ++r) {
        T* dst = op + tile.offset(r, t.head, L.num_heads, head_dim);
        const float inv = 1.f / total[r];
        for (int64_t d = 0; d < head_dim; ++d) dst[d] = static_cast<T>(acc[r * head_dim + d] * inv);
      }
    }
  });
}

#if defined(__AVX512BF16__)
// Lanes 2i and 2i + 1 of the result: lane i of a's and of b's first (or second) 16 bfloat16.
inline __m512i interleave_bf16(__m512i a, __m512i b, bool second) {
  alignas(64) static const int16_t kFirst[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                 8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const int16_t kSecond[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  return _mm512_permutex2var_epi16(a, _mm512_load_si512(second ? kSecond : kFirst), b);
}

// O[rows R at a time] += P V for one step's 16 keys: each row's bfloat16 pairs of P (keys 2k,
// 2k + 1) broadcast against V's rows 2k and 2k + 1 interleaved, for 16 output lanes at a time.
template <int R, int64_t D>
inline void add_pv(float* o, const float* correction, const uint32_t* p_pairs, const uint32_t* v_pairs, int64_t r) {
  constexpr int64_t kChunks = D / 16;
  __m512 acc[R][kChunks];
  for (int i = 0; i < R; ++i) {
    const __m512 c = _mm512_set1_ps(correction[r + i]);
    for (int64_t ch = 0; ch < kChunks; ++ch) acc[i][ch] = _mm512_mul_ps(_mm512_loadu_ps(o + (r + i) * D + 16 * ch), c);
  }
  for (int64_t k = 0; k < kKeys / 2; ++k) {
    __m512bh v[kChunks];
    for (int64_t ch = 0; ch < kChunks; ++ch) v[ch] = (__m512bh)_mm512_load_si512(v_pairs + k * D + 16 * ch);
    for (int i = 0; i < R; ++i) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int>(p_pairs[k * kKeys + (r + i) % kKeys]));
      for (int64_t ch = 0; ch < kChunks; ++ch) acc[i][ch] = _mm512_dpbf16_ps(acc[i][ch], p, v[ch]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int64_t ch = 0; ch < kChunks; ++ch) _mm512_storeu_ps(o + (r + i) * D + 16 * ch, acc[i][ch]);
}

// bfloat16 with AVX512-BF16. Within a task, 16 rows share each vector: scores of one key for 16
// rows are one dpbf16 chain (the rows' queries packed once per task as bfloat16 pairs along the
// head dimension, each key's pairs broadcast), so the softmax's maxima, exponentials and sums
// are vertical, never across lanes. P V pairs P along keys (rounded to bfloat16, as GPU flash
// attention rounds it) against V's rows interleaved in pairs, packed once per step of 16 keys.
template <int64_t D>
void chunks_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache, const Chunks& c,
                 int64_t num_chunks, double scale, at::Tensor& out) {
  static_assert(D % 32 == 0, "whole vectors of bfloat16 pairs");
  constexpr int64_t kPairs = D / 2, kGroups = kTileRows / 16;
  constexpr int kRows = D == 64 ? 4 : 2;  // rows of P V at a time: 16 accumulators
  const Layout L(q, k_cache);
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr());
  const float log2_scale = static_cast<float>(scale) * 1.4426950408889634f;  // softmax in base 2
  const std::vector<Task> tasks = plan_tasks(c, num_chunks, L.kv_heads, L.group);
  alignas(64) static const uint16_t kZeros[D] = {};
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> q_pairs(kGroups * kPairs * 16);  // [group of 16 rows][pair][row]
    std::vector<float> o(kTileRows * D);
    alignas(64) uint32_t v_pairs[kKeys / 2 * D];  // [key pair][d]: V's rows 2k, 2k + 1 interleaved
    alignas(64) uint32_t p_pairs[kKeys / 2 * kKeys];  // [key pair][row of the group]
    alignas(64) float correction[kTileRows], top[kTileRows], total[kTileRows];
    alignas(64) int32_t positions[kTileRows];
    for (int64_t i = begin; i < end; ++i) {
      const Task& t = tasks[i];
      const TaskRows tile(c, t, L.group);
      const int64_t groups = (tile.rows + 15) / 16;
      for (int64_t r = 0; r < groups * 16; ++r) {  // rows past the tile: zero queries, the last position
        const uint32_t* src =
            r < tile.rows ? reinterpret_cast<const uint32_t*>(qp + tile.offset(r, t.head, L.num_heads, D)) : nullptr;
        for (int64_t p = 0; p < kPairs; ++p) q_pairs[((r / 16) * kPairs + p) * 16 + r % 16] = src ? src[p] : 0;
        positions[r] = static_cast<int32_t>(tile.position(std::min(r, tile.rows - 1)));
      }
      std::fill(o.begin(), o.end(), 0.f);
      std::fill(top, top + kTileRows, kStartMax);
      std::fill(total, total + kTileRows, 0.f);
      for (int64_t k0 = 0; k0 < tile.keys; k0 += kKeys) {
        const uint16_t* k_rows[kKeys];
        for (int64_t j = 0; j < kKeys; ++j) {
          const bool seen = k0 + j < tile.keys;
          k_rows[j] = seen ? L.row(kp, c, t.chunk, k0 + j, t.head) : kZeros;
        }
        for (int64_t k = 0; k < kKeys / 2; ++k) {  // V's rows past the keys are zeros: 0 x NaN is NaN
          const uint16_t* a = k0 + 2 * k < tile.keys ? L.row(vp, c, t.chunk, k0 + 2 * k, t.head) : kZeros;
          const uint16_t* b = k0 + 2 * k + 1 < tile.keys ? L.row(vp, c, t.chunk, k0 + 2 * k + 1, t.head) : kZeros;
          for (int64_t d = 0; d < D; d += 32) {
            const __m512i va = _mm512_loadu_si512(a + d), vb = _mm512_loadu_si512(b + d);
            _mm512_store_si512(v_pairs + k * D + d, interleave_bf16(va, vb, false));
            _mm512_store_si512(v_pairs + k * D + d + 16, interleave_bf16(va, vb, true));
          }
        }
        for (int64_t g = 0; g < groups; ++g) {
          const int64_t r0 = g * 16, r_end = std::min(tile.rows, r0 + 16);
          if (positions[r_end - 1] < k0) continue;  // no row of the group sees these keys yet
          __m512 s[kKeys];
          for (int64_t j = 0; j < kKeys; ++j) s[j] = _mm512_setzero_ps();
          const uint32_t* qg = q_pairs.data() + g * kPairs * 16;
          for (int64_t p = 0; p < kPairs; ++p) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qg + p * 16);
            for (int64_t j = 0; j < kKeys; ++j) {
              const int32_t pair = reinterpret_cast<const int32_t*>(k_rows[j])[p];
              s[j] = _mm512_dpbf16_ps(s[j], (__m512bh)_mm512_set1_epi32(pair), qv);
            }
          }
          const __m512i pos = _mm512_load_si512(positions + r0);
          const bool causal = k0 + kKeys - 1 > positions[r0];  // some row of the group must not see some key
          __m512 raw_peak = _mm512_set1_ps(kNoScore);  // of the unscaled scores: the scale is positive
          for (int64_t j = 0; j < kKeys; ++j) {
            if (causal) {
              const __mmask16 visible = _mm512_cmple_epi32_mask(_mm512_set1_epi32(int32_t(k0 + j)), pos);
              s[j] = _mm512_mask_blend_ps(visible, _mm512_set1_ps(kNoScore), s[j]);
            }
            raw_peak = _mm512_max_ps(raw_peak, s[j]);
          }
          const __m512 scale2 = _mm512_set1_ps(log2_scale), old_peak = _mm512_load_ps(top + r0);
          const __m512 peak = _mm512_max_ps(old_peak, _mm512_mul_ps(raw_peak, scale2));
          const __m512 corr = argosy_vec::exp2_16(_mm512_sub_ps(old_peak, peak));
          __m512 sum = _mm512_setzero_ps();
          for (int64_t j = 0; j < kKeys; ++j) {
            s[j] = argosy_vec::exp2_16(_mm512_fmsub_ps(s[j], scale2, peak));
            sum = _mm512_add_ps(sum, s[j]);
          }
          _mm512_store_ps(top + r0, peak);
          _mm512_store_ps(total + r0, _mm512_fmadd_ps(_mm512_load_ps(total + r0), corr, sum));
          _mm512_store_ps(correction + r0, corr);
          for (int64_t k = 0; k < kKeys / 2; ++k) {
            const __m512i lo = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(s[2 * k]));
            const __m512i hi = _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(s[2 * k + 1]));
            _mm512_store_si512(p_pairs + k * kKeys, interleave_bf16(lo, hi, false));
          }
          int64_t r = r0;
          for (; r + kRows <= r_end; r += kRows) add_pv<kRows, D>(o.data(), correction, p_pairs, v_pairs, r);
          for (; r < r_end; ++r) add_pv<1, D>(o.data(), correction, p_pairs, v_pairs, r);
        }
      }
      for (int64_t r = 0; r < tile.rows; ++r) {
        uint16_t* dst = op + tile.offset(r, t.head, L.num_heads, D);
        const __m512 inv = _mm512_set1_ps(1.f / total[r]);
        for (int64_t ch = 0; ch < D / 16; ++ch) {
          const __m256bh narrow = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(o.data() + r * D + 16 * ch), inv));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 16 * ch), (__m256i)narrow);
        }
      }
    }
  });
}
#endif

}  // namespace

// q, out: [tokens, heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim]; q_start,
// q_len, seq_lens: [chunks]; block_tables: [chunks, max_blocks]. Writes each chunk's rows of out.
void paged_chunk_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                           const at::Tensor& q_start, const at::Tensor& q_len, const at::Tensor& seq_lens,
                           const at::Tensor& block_tables, double scale, at::Tensor& out) {
  check_on_cpu("paged_chunk_attention", q, k_cache, v_cache, q_start, q_len, seq_lens, block_tables, out);
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous(), "q and out must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  for (const at::Tensor* t : {&q_start, &q_len, &seq_lens, &block_tables})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous(), "indices must be contiguous int64");
  const Chunks chunks{q_start.data_ptr<int64_t>(), q_len.data_ptr<int64_t>(), seq_lens.data_ptr<int64_t>(),
                      block_tables.data_ptr<int64_t>(), block_tables.size(1)};
  const int64_t n = q_start.size(0);
#if defined(__AVX512BF16__)
  if (q.scalar_type() == at::kBFloat16 && k_cache.scalar_type() == at::kBFloat16) {
    if (q.size(2) == 64) return chunks_bf16<64>(q, k_cache, v_cache, chunks, n, scale, out);
    if (q.size(2) == 128) return chunks_bf16<128>(q, k_cache, v_cache, chunks, n, scale, out);
  }
#endif
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "paged_chunk_attention", [&] {
    switch (q.size(2)) {
      case 64: return chunks_generic<scalar_t, 64>(q, k_cache, v_cache, chunks, n, scale, out);
      case 128: return chunks_generic<scalar_t, 128>(q, k_cache, v_cache, chunks, n, scale, out);
      default: return chunks_generic<scalar_t, 0>(q, k_cache, v_cache, chunks, n, scale, out);
    }
  });
}
