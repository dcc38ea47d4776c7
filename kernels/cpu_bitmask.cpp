// A grammar's token masks applied to float32 logits in place: bit t of a row's mask (int32 words,
// 32 tokens each, lowest bit first) clear sets logit t to -inf. A word with every bit set is
// skipped and one with none is a plain fill, which the compiler vectorizes: in a JSON string
// most words allow all, between its tokens most allow none.

#include <algorithm>
#include <cstdint>
#include <limits>

#include "cpu_device.h"

void apply_token_bitmask(at::Tensor& logits, const at::Tensor& bitmask, const at::Tensor& rows) {
  check_on_cpu("apply_token_bitmask", logits, bitmask, rows);
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == at::kFloat && logits.stride(1) == 1,
              "apply_token_bitmask: logits must be float32 [rows, vocab] with contiguous rows");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == at::kInt && bitmask.is_contiguous(),
              "apply_token_bitmask: bitmask must be contiguous int32 [rows, words]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == at::kLong, "apply_token_bitmask: rows must be int64");
  const int64_t vocab = logits.size(1), words = bitmask.size(1);
  TORCH_CHECK(words * 32 >= vocab, "apply_token_bitmask: the bitmask is narrower than the vocabulary");
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows.size(0); ++i)
    TORCH_CHECK(row_ids[i] >= 0 && row_ids[i] < logits.size(0) && row_ids[i] < bitmask.size(0),
                "apply_token_bitmask: row ", row_ids[i], " is out of range");
  float* base = logits.data_ptr<float>();
  const int32_t* masks = bitmask.data_ptr<int32_t>();
  const int64_t stride = logits.stride(0);
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, rows.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* row = base + row_ids[i] * stride;
      const uint32_t* mask = reinterpret_cast<const uint32_t*>(masks + row_ids[i] * words);
      for (int64_t w = 0; w * 32 < vocab; ++w) {
        const uint32_t bits = mask[w];
        if (bits == 0xFFFFFFFFu) continue;
        float* out = row + w * 32;
        const int64_t n = std::min<int64_t>(32, vocab - w * 32);
        if (bits == 0) {
          std::fill(out, out + n, kBanned);
          continue;
        }
        for (int64_t b = 0; b < n; ++b)
          if (!((bits >> b) & 1u)) out[b] = kBanned;
      }
    }
  });
}
