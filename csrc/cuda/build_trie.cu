// build_trie: one CTA per batch row. The row's beams are staged in shared memory; one thread per
// draft position (w, d) finds its owner, the lowest beam sharing the draft prefix 1..d (every beam
// sharing a prefix carries the owner's node for it). Owned positions are new nodes, numbered in
// flat order w*(L-1) + d-1 (first occurrence, beam-major then depth, like the reference) with a
// block-wide ballot + prefix count; shared positions then copy the owner's node id.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

// W*L per row: 13 bytes of shared memory each must fit the 163 KB a block may take on sm_80
constexpr int64_t kMaxBeamTokens = 12288;
constexpr int kMaxThreads = 1024;           // the launch uses up to this many: bound registers to fit

__host__ __device__ constexpr int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

template <typename I>
__global__ void __launch_bounds__(kMaxThreads) build_trie_kernel(const I* __restrict__ beams, int64_t W, int64_t L, int32_t* __restrict__ node_token,
                                  int32_t* __restrict__ node_parent, int32_t* __restrict__ node_depth,
                                  int32_t* __restrict__ beam_node, int32_t* __restrict__ num_nodes) {
  const int64_t b = blockIdx.x;
  const int64_t WL = W * L, N = 1 + W * (L - 1), P = W * (L - 1);
  unsigned char* sm = dynamic_smem<unsigned char>();
  I* tok = reinterpret_cast<I*>(sm);                                                 // [W, L]
  int32_t* node = reinterpret_cast<int32_t*>(sm + align16(WL * int64_t(sizeof(I))));  // [W, L]
  int* scratch = node + WL;                                                          // [32]
  unsigned char* is_new = reinterpret_cast<unsigned char*>(scratch + 32);            // [W, L]
  for (int64_t k = threadIdx.x; k < WL; k += blockDim.x) tok[k] = beams[b * WL + k];
  __syncthreads();

  // pass 1: owners; new positions get consecutive ids in flat order
  int32_t next = 1;
  for (int64_t t0 = 0; t0 < P; t0 += blockDim.x) {
    const int64_t t = t0 + threadIdx.x;
    bool fresh = false;
    int64_t w = 0, d = 0, owner = 0;
    if (t < P) {
      w = t / (L - 1);
      d = t % (L - 1) + 1;
      owner = w;
      for (int64_t v = 0; v < w && owner == w; ++v) {
        int64_t k = 1;
        while (k <= d && tok[v * L + k] == tok[w * L + k]) ++k;
        if (k > d) owner = v;
      }
      fresh = owner == w;
    }
    int total = 0;
    const int rank = block_prefix_count(fresh, scratch, &total);
    if (t < P) {
      node[w * L + d] = fresh ? next + rank : -1 - static_cast<int32_t>(owner);
      is_new[w * L + d] = fresh;
    }
    next += total;
  }
  for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {
    node[w * L] = 0;
    is_new[w * L] = 0;
  }
  __syncthreads();
  // pass 2: shared positions take the owner's node (a new node there, final since pass 1)
  for (int64_t t = threadIdx.x; t < P; t += blockDim.x) {
    const int64_t w = t / (L - 1), d = t % (L - 1) + 1;
    const int32_t n = node[w * L + d];
    if (n < 0) node[w * L + d] = node[(-1 - static_cast<int64_t>(n)) * L + d];
  }
  __syncthreads();
  // pass 3: outputs
  for (int64_t k = threadIdx.x; k < WL; k += blockDim.x) {
    const int32_t n = node[k];
    beam_node[b * WL + k] = n;
    if (is_new[k]) {
      const int64_t d = k % L;
      node_token[b * N + n] = static_cast<int32_t>(tok[k]);
      node_parent[b * N + n] = node[k - 1];
      node_depth[b * N + n] = static_cast<int32_t>(d);
    }
  }
  if (threadIdx.x == 0) {
    node_token[b * N] = static_cast<int32_t>(tok[0]);  // the root: beam 0's guaranteed token
    node_parent[b * N] = -1;
    node_depth[b * N] = 0;
    num_nodes[b] = next;
  }
  for (int64_t n = next + threadIdx.x; n < N; n += blockDim.x) {  // padding
    node_token[b * N + n] = 0;
    node_parent[b * N + n] = -1;
    node_depth[b * N + n] = 0;
  }
}

template <typename I>
cudaError_t launch(const I* beams, int64_t B, int64_t W, int64_t L, int32_t* node_token, int32_t* node_parent,
                   int32_t* node_depth, int32_t* beam_node, int32_t* num_nodes, cudaStream_t stream) {
  const int64_t P = W * (L - 1);
  const int64_t threads = P >= kMaxThreads ? kMaxThreads : (P < 32 ? 32 : (P + 31) / 32 * 32);
  const size_t smem = static_cast<size_t>(align16(W * L * int64_t(sizeof(I))) + W * L * 4 + 32 * 4 + W * L);
  return launch_kernel(build_trie_kernel<I>, dim3(static_cast<unsigned>(B)), dim3(static_cast<unsigned>(threads)), smem,
                       stream, beams, W, L, node_token, node_parent, node_depth, beam_node, num_nodes);
}

}  // namespace

int64_t build_trie_max_beam_tokens() { return kMaxBeamTokens; }

cudaError_t build_trie(const void* beams, IndexType beams_type, int64_t B, int64_t W, int64_t L,
                       int32_t* node_token, int32_t* node_parent, int32_t* node_depth, int32_t* beam_node,
                       int32_t* num_nodes, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (W < 1 || L < 1 || W * L > kMaxBeamTokens || B > 0x7fffffff) return cudaErrorInvalidValue;
  if (beams_type == IndexType::kInt64) {
    return launch(static_cast<const int64_t*>(beams), B, W, L, node_token, node_parent, node_depth, beam_node,
                  num_nodes, stream);
  }
  return launch(static_cast<const int32_t*>(beams), B, W, L, node_token, node_parent, node_depth, beam_node,
                num_nodes, stream);
}

}  // namespace redrafter::cuda
