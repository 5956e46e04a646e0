// tree_mask: one CTA per trie. The parent array is staged in shared memory; each thread owns
// whole mask rows and walks its node's ancestor chain (ancestors have strictly lower indices,
// so the walk also terminates on malformed input).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kThreads = 256;
// the row's parents are staged in shared memory (4 bytes a node): at most 160 KB, which sm_80 allows
constexpr int64_t kMaxNodes = 40960;

// Stages trie b's parent array in shared memory (-1 past num_nodes[b]); the caller syncs before
// reading it.
__device__ __forceinline__ const int32_t* stage_parents(const int32_t* __restrict__ node_parent,
                                                        const int32_t* __restrict__ num_nodes, int64_t b, int64_t N) {
  int32_t* parent = dynamic_smem<int32_t>();
  const int64_t n_valid = num_nodes[b];
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    parent[i] = i < n_valid ? node_parent[b * N + i] : -1;
  }
  return parent;
}

__global__ void __launch_bounds__(kThreads) tree_mask_bool_kernel(const int32_t* __restrict__ node_parent,
                                      const int32_t* __restrict__ num_nodes, int64_t N,
                                      bool* __restrict__ mask) {
  const int64_t b = blockIdx.x;
  const int32_t* parent = stage_parents(node_parent, num_nodes, b, N);
  bool* m = mask + b * N * N;
  // coalesced zero fill of the whole [N, N] block before the scattered ancestor writes
  for (int64_t k = threadIdx.x; k < N * N; k += blockDim.x) m[k] = false;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    bool* row = m + i * N;
    int64_t j = i;
    while (true) {
      row[j] = true;
      const int64_t p = parent[j];
      if (p < 0 || p >= j) break;
      j = p;
    }
  }
}

__global__ void __launch_bounds__(kThreads) tree_mask_packed_kernel(const int32_t* __restrict__ node_parent,
                                        const int32_t* __restrict__ num_nodes, int64_t N,
                                        uint32_t* __restrict__ words) {
  const int64_t b = blockIdx.x;
  const int32_t* parent = stage_parents(node_parent, num_nodes, b, N);
  const int64_t nw = (N + 31) / 32;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) {
    uint32_t* row = words + (b * N + i) * nw;
    // ancestors come in decreasing index order, so words are completed from high to low
    int64_t w = nw - 1;
    uint32_t acc = 0;
    int64_t j = i;
    while (j >= 0) {
      const int64_t wj = j / 32;
      for (; w > wj; --w) {
        row[w] = acc;
        acc = 0;
      }
      acc |= 1u << (j % 32);
      const int64_t p = parent[j];
      j = (p >= 0 && p < j) ? p : -1;
    }
    for (; w >= 0; --w) {
      row[w] = acc;
      acc = 0;
    }
  }
}

}  // namespace

int64_t tree_mask_max_nodes() { return kMaxNodes; }

cudaError_t tree_mask(const int32_t* node_parent, const int32_t* num_nodes, int64_t B, int64_t N,
                      bool packed, void* out, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (N > kMaxNodes) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(N) * sizeof(int32_t);
  if (packed) {
    return launch_kernel(tree_mask_packed_kernel, dim3(static_cast<unsigned>(B)), dim3(kThreads), smem,
                         stream, node_parent, num_nodes, N, static_cast<uint32_t*>(out));
  }
  return launch_kernel(tree_mask_bool_kernel, dim3(static_cast<unsigned>(B)), dim3(kThreads), smem,
                       stream, node_parent, num_nodes, N, static_cast<bool*>(out));
}

}  // namespace redrafter::cuda
