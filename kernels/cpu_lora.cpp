// The LoRA products of a step on CPUs, for one adapted layer, in one call: for every run of
// consecutive tokens of one adapter slot, shrink (s = A[slot] x, every slice's ranks at once)
// then expand into the layer's output (out[rows of slice i] += B[slot][rows] s[slice i's
// ranks]). What PyTorch does in 1 + slices small matrix products per adapter, each paying a
// dispatch and a GEMM set-up that cost more than its arithmetic at decode sizes.
//
// x [tokens, in] and out [tokens, out] (rows contiguous), a [slots, slices * rank, in] and
// b [slots, out, rank] (contiguous), all float32 or all bfloat16; the sums are float32, and out
// is rounded once, as the reference (lora_ops.lora_reference) rounds.

#include <vector>

#include "cpu_bf16.h"
#include "cpu_device.h"

namespace {

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) { return argosy_bf16::widen(p[i]); }
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = argosy_bf16::narrow(v); }

template <typename T>
float dot(const T* a, const float* x, int64_t n) {
  float sum = 0.f;
  for (int64_t k = 0; k < n; ++k) sum += load(a, k) * x[k];
  return sum;
}

struct Run {
  int64_t slot, start, end;
};

template <typename T>
void lora_runs_typed(const at::Tensor& x, at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                     const std::vector<int64_t>& bounds, const std::vector<Run>& runs) {
  const int64_t fan_in = x.size(1), rows = out.size(1), nr = a.size(1), rank = b.size(2);
  const int64_t x_stride = x.stride(0), out_stride = out.stride(0);
  const T* xp = reinterpret_cast<const T*>(x.data_ptr());
  const T* ap = reinterpret_cast<const T*>(a.data_ptr());
  const T* bp = reinterpret_cast<const T*>(b.data_ptr());
  T* op = reinterpret_cast<T*>(out.data_ptr());
  // Each adapter token's input in float32, once, and its shrunk vector.
  int64_t tokens = 0;
  std::vector<int64_t> first(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) first[i] = tokens, tokens += runs[i].end - runs[i].start;
  std::vector<float> xs(tokens * fan_in), shrunk(tokens * nr);
  for (size_t i = 0; i < runs.size(); ++i)
    for (int64_t t = runs[i].start; t < runs[i].end; ++t)
      for (int64_t k = 0; k < fan_in; ++k) xs[(first[i] + t - runs[i].start) * fan_in + k] = load(xp, t * x_stride + k);
  // Shrink: one task per (run, rank row); the A row stays in cache over the run's tokens.
  const int64_t shrink_tasks = static_cast<int64_t>(runs.size()) * nr;
  at::parallel_for(0, shrink_tasks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / nr, r = task % nr;
      const Run& run = runs[i];
      const T* a_row = ap + (run.slot * nr + r) * fan_in;
      for (int64_t t = 0; t < run.end - run.start; ++t)
        shrunk[(first[i] + t) * nr + r] = dot(a_row, &xs[(first[i] + t) * fan_in], fan_in);
    }
  });
  // Expand: one task per (run, block of output rows).
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  at::parallel_for(0, static_cast<int64_t>(runs.size()) * blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / blocks, lo = (task % blocks) * kBlock, hi = std::min(rows, lo + kBlock);
      const Run& run = runs[i];
      size_t piece = 0;
      for (int64_t o = lo; o < hi; ++o) {
        while (o >= bounds[piece + 1]) ++piece;
        const T* b_row = bp + (run.slot * rows + o) * rank;
        for (int64_t t = 0; t < run.end - run.start; ++t) {
          const float added = dot(b_row, &shrunk[(first[i] + t) * nr + piece * rank], rank);
          const int64_t at = (run.start + t) * out_stride + o;
          store(op, at, load(op, at) + added);
        }
      }
    }
  });
}

}  // namespace

// runs: int64 [k, 3], each (slot, first token, end); bounds: the slices' output rows, from 0 to out.
void lora_runs(const at::Tensor& x, at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
               const std::vector<int64_t>& bounds, const at::Tensor& runs) {
  check_on_cpu("lora_runs", x, out, a, b, runs);
  TORCH_CHECK(x.dim() == 2 && out.dim() == 2 && x.size(0) == out.size(0), "x [tokens, in], out [tokens, out]");
  TORCH_CHECK(x.stride(1) == 1 && out.stride(1) == 1, "x and out: rows contiguous");
  TORCH_CHECK(a.is_contiguous() && b.is_contiguous() && a.dim() == 3 && b.dim() == 3, "a and b: contiguous stacks");
  TORCH_CHECK(a.size(2) == x.size(1) && b.size(1) == out.size(1) && a.size(0) == b.size(0), "a, b: the layer's shapes");
  const auto dtype = x.scalar_type();
  TORCH_CHECK(out.scalar_type() == dtype && a.scalar_type() == dtype && b.scalar_type() == dtype, "one dtype");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "float32 or bfloat16");
  const int64_t slices = static_cast<int64_t>(bounds.size()) - 1;
  TORCH_CHECK(slices >= 1 && bounds.front() == 0 && bounds.back() == out.size(1), "bounds: 0 .. out");
  TORCH_CHECK(a.size(1) == slices * b.size(2), "a holds every slice's ranks");
  TORCH_CHECK(runs.scalar_type() == at::kLong && runs.is_contiguous() && runs.dim() == 2 && runs.size(1) == 3,
              "runs: int64 [k, 3]");
  std::vector<Run> parsed(runs.size(0));
  const int64_t* r = runs.data_ptr<int64_t>();
  for (int64_t i = 0; i < runs.size(0); ++i) {
    parsed[i] = {r[3 * i], r[3 * i + 1], r[3 * i + 2]};
    TORCH_CHECK(parsed[i].slot >= 0 && parsed[i].slot < a.size(0), "run ", i, ": slot out of range");
    TORCH_CHECK(0 <= parsed[i].start && parsed[i].start <= parsed[i].end && parsed[i].end <= x.size(0),
                "run ", i, ": tokens out of range");
  }
  if (dtype == at::kFloat)
    lora_runs_typed<float>(x, out, a, b, bounds, parsed);
  else
    lora_runs_typed<uint16_t>(x, out, a, b, bounds, parsed);
}
