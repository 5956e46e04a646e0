// ngram_lookup: one CTA per batch row. Each thread scans a strided share of the candidate ends e
// of an occurrence (e <= n_b - 2) and keeps the best key run * (S + 1) + e, run the number of
// trailing tokens at e equal to the row's last ones (at most max_n): one block-wide max then picks
// the longest key and, among equals, the latest occurrence, exactly the CPU kernel's choice.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kThreads = 256;

template <typename I>
__global__ void __launch_bounds__(kThreads) ngram_lookup_kernel(const I* __restrict__ tokens, const I* __restrict__ length,
                                                                int64_t S, int64_t max_n, int64_t m,
                                                                int32_t* __restrict__ drafts) {
  const int64_t b = blockIdx.x;
  const I* t = tokens + b * S;
  long long* best = dynamic_smem<long long>();  // [blockDim.x]
  const int64_t raw = static_cast<int64_t>(length[b]);
  const int64_t n_b = raw < 0 ? 0 : (raw > S ? S : raw);  // out-of-range lengths are clamped
  const int64_t cap = max_n < n_b - 1 ? max_n : n_b - 1;
  long long mine = 0;  // 0: no occurrence (a match has run >= 1, so its key is >= S + 1)
  for (int64_t e = threadIdx.x; e <= n_b - 2; e += blockDim.x) {
    const int64_t limit = cap < e + 1 ? cap : e + 1;
    int64_t run = 0;
    while (run < limit && t[e - run] == t[n_b - 1 - run]) ++run;
    const long long key = run > 0 ? static_cast<long long>(run) * (S + 1) + e : 0;
    mine = key > mine ? key : mine;
  }
  best[threadIdx.x] = mine;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {  // blockDim.x is a power of two
    if (threadIdx.x < half && best[threadIdx.x + half] > best[threadIdx.x]) best[threadIdx.x] = best[threadIdx.x + half];
    __syncthreads();
  }
  const long long top = best[0];
  const int64_t q = top % (S + 1) + 1, period = n_b - q;
  for (int64_t k = threadIdx.x; k < m; k += blockDim.x) {
    drafts[b * m + k] = top == 0 ? -1 : static_cast<int32_t>(t[q + k % period]);
  }
}

template <typename I>
cudaError_t launch(const I* tokens, const I* length, int64_t B, int64_t S, int64_t max_n, int64_t m,
                   int32_t* drafts, cudaStream_t stream) {
  // short histories need few threads: the smallest power of two >= S (at least a warp)
  int threads = 32;
  while (threads < kThreads && threads < S) threads *= 2;
  return launch_kernel("ngram_lookup", ngram_lookup_kernel<I>, dim3(static_cast<unsigned>(B)),
                       dim3(static_cast<unsigned>(threads)), static_cast<size_t>(threads) * sizeof(long long), stream,
                       tokens, length, S, max_n, m, drafts);
}

}  // namespace

cudaError_t ngram_lookup(const void* tokens, const void* length, IndexType index_type, int64_t B, int64_t S,
                         int64_t max_n, int64_t m, int32_t* drafts, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (S < 1 || max_n < 1 || m < 1 || B > 0x7fffffff) return cudaErrorInvalidValue;
  if (index_type == IndexType::kInt64) {
    return launch(static_cast<const int64_t*>(tokens), static_cast<const int64_t*>(length), B, S, max_n, m, drafts,
                  stream);
  }
  return launch(static_cast<const int32_t*>(tokens), static_cast<const int32_t*>(length), B, S, max_n, m, drafts,
                stream);
}

}  // namespace redrafter::cuda
