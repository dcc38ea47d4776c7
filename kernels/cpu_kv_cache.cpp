// Writing a step's new keys and values into the paged cache on CPUs: one row copy per token
// and tensor, where index_copy_ costs a dispatch and an iterator for each of them.

#include <cstring>

#include "cpu_device.h"

namespace {

void check(const at::Tensor& x, const at::Tensor& cache, const char* name) {
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), name,
              ": [tokens, kv_heads, head_dim] with each token's heads contiguous");
  TORCH_CHECK(cache.is_contiguous() && cache.scalar_type() == x.scalar_type(), name, "'s cache: contiguous, same dtype");
  TORCH_CHECK(cache.size(2) * cache.size(3) == x.size(1) * x.size(2), name, " does not fit its cache's rows");
}

}  // namespace

// k, v: [tokens, kv_heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim];
// slot_mapping: int64 [tokens], flat slots (block * block_size + offset).
void write_kv(const at::Tensor& k, const at::Tensor& v, at::Tensor& k_cache, at::Tensor& v_cache,
              const at::Tensor& slot_mapping) {
  check_on_cpu("write_kv", k, v, k_cache, v_cache, slot_mapping);
  check(k, k_cache, "k");
  check(v, v_cache, "v");
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.is_contiguous(), "slot_mapping: int64");
  const int64_t tokens = k.size(0), num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t row_bytes = k.size(1) * k.size(2) * k.element_size();
  const int64_t* slots = slot_mapping.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) TORCH_CHECK(slots[t] >= 0 && slots[t] < num_slots, "slot out of range");
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const int64_t ks = k.stride(0) * k.element_size(), vs = v.stride(0) * v.element_size();
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(kc + slots[t] * row_bytes, kp + t * ks, row_bytes);
      std::memcpy(vc + slots[t] * row_bytes, vp + t * vs, row_bytes);
    }
  });
}
