// verify_greedy in two launches:
//  1. argmax (grid B*n_rows*S CTAs): the target's argmax of every node that some beam position
//     references, each row of V split into S chunks so that even B = 1 fills the GPU; one pass
//     over the chunk with 16-byte loads, the (value, index) maximum packed into one 64-bit key
//     (float order key high, ~index low: the first maximum wins, a NaN is the maximum and the first
//     NaN wins, like torch.argmax), reduced over the block and written per (node, chunk).
//     Padding rows (referenced by no beam) are not read.
//  2. walk (grid B): one thread per beam follows it from the root while the draft token equals
//     the argmax at its parent (the max of the node's S partial keys), then a block reduction
//     picks the longest beam (lowest index on ties) and writes the path.
// Bound: one read of the referenced nodes' logits; the walk moves a few KB.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
constexpr int kWalkThreads = 256;
constexpr int64_t kTargetCtas = 264;  // 2 waves on a 132-SM GPU
constexpr int64_t kMinChunkBytes = 16 * 1024;

struct Plan {
  int64_t S, chunk;  // splits per row, elements per split (a multiple of 8)
};

inline Plan make_plan(int64_t rows, int64_t V, int64_t elem_bytes) {
  const int64_t min_chunk = kMinChunkBytes / elem_bytes;
  int64_t S = (kTargetCtas + rows - 1) / rows;
  const int64_t max_s = (V + min_chunk - 1) / min_chunk;
  S = S < max_s ? S : max_s;
  S = S < 1 ? 1 : S;
  int64_t chunk = (V + S - 1) / S;
  chunk = (chunk + 7) / 8 * 8;
  return {(V + chunk - 1) / chunk, chunk};
}

__device__ __forceinline__ uint64_t pack(float x, int64_t i) {
  return (static_cast<uint64_t>(order_key(x)) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ uint64_t max_u64(uint64_t a, uint64_t b) { return a > b ? a : b; }

template <typename T, typename I>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const T* __restrict__ logits, int64_t n_rows, int64_t V, const I* __restrict__ beam_node,
                  int64_t WL, Plan p, uint64_t* __restrict__ partial) {
  const int64_t cta = blockIdx.x, s = cta % p.S, row = cta / p.S, b = row / n_rows, node = row % n_rows;
  // skip padding rows: no beam position references this node
  bool used = false;
  for (int64_t i = threadIdx.x; i < WL; i += blockDim.x) used |= static_cast<int64_t>(ld_global(beam_node + b * WL + i)) == node;
  if (!__syncthreads_or(used)) return;  // block-uniform
  const int64_t lo = s * p.chunk, hi = lo + p.chunk < V ? lo + p.chunk : V;
  uint64_t best = 0;
  block_for_each(logits + row * V, lo, hi, [&](int64_t i, float x) { best = max_u64(best, pack(x, i)); });
  for (int off = 16; off > 0; off >>= 1) best = max_u64(best, __shfl_xor_sync(kFullMask, best, off));
  uint64_t* red = dynamic_smem<uint64_t>();
  if (lane_id() == 0) red[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (unsigned w = 1; w < (blockDim.x >> 5); ++w) best = max_u64(best, red[w]);
    st_global(partial + row * p.S + s, best);
  }
}

// a before b: longer, or as long and a lower beam
__device__ __forceinline__ bool beam_before(int32_t la, int32_t wa, int32_t lb, int32_t wb) {
  return la > lb || (la == lb && wa < wb);
}

template <typename I>
__global__ void __launch_bounds__(kWalkThreads)
    walk_kernel(const uint64_t* __restrict__ partial, int64_t n_rows, int64_t S, const I* __restrict__ beams,
                const I* __restrict__ beam_node, int64_t W, int64_t L, int32_t* __restrict__ accept_len,
                int32_t* __restrict__ best_beam, int32_t* __restrict__ path_nodes, int32_t* __restrict__ next_token) {
  const int64_t b = blockIdx.x;
  auto target = [&](int64_t node) -> int32_t {
    if (node < 0 || node >= n_rows) return -1;
    uint64_t k = 0;
    for (int64_t s = 0; s < S; ++s) k = max_u64(k, ld_global(partial + (b * n_rows + node) * S + s));
    return static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(k));
  };
  int32_t best_len = -1, best = static_cast<int32_t>(W), best_last = -1;
  for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {  // increasing: strict > keeps the lowest
    const I* t = beams + (b * W + w) * L;
    const I* nw = beam_node + (b * W + w) * L;
    int64_t len = 0;
    int32_t tgt = -1;
    while (true) {
      tgt = target(static_cast<int64_t>(ld_global(nw + len)));
      if (len == L - 1 || tgt < 0 || static_cast<int64_t>(ld_global(t + len + 1)) != tgt) break;
      ++len;
    }
    if (static_cast<int32_t>(len) > best_len) {
      best_len = static_cast<int32_t>(len);
      best = static_cast<int32_t>(w);
      best_last = tgt;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const int32_t ol = __shfl_xor_sync(kFullMask, best_len, off);
    const int32_t ob = __shfl_xor_sync(kFullMask, best, off);
    const int32_t ot = __shfl_xor_sync(kFullMask, best_last, off);
    if (beam_before(ol, ob, best_len, best)) {
      best_len = ol;
      best = ob;
      best_last = ot;
    }
  }
  int32_t* red = dynamic_smem<int32_t>();  // [3 * 32]
  if (lane_id() == 0) {
    red[3 * (threadIdx.x >> 5)] = best_len;
    red[3 * (threadIdx.x >> 5) + 1] = best;
    red[3 * (threadIdx.x >> 5) + 2] = best_last;
  }
  __syncthreads();
  for (unsigned w = 0; w < (blockDim.x >> 5); ++w) {
    if (beam_before(red[3 * w], red[3 * w + 1], best_len, best)) {
      best_len = red[3 * w];
      best = red[3 * w + 1];
      best_last = red[3 * w + 2];
    }
  }
  const I* path = beam_node + (b * W + best) * L;
  for (int64_t i = threadIdx.x; i < L; i += blockDim.x) {
    st_global(path_nodes + b * L + i, i <= best_len ? static_cast<int32_t>(ld_global(path + i)) : -1);
  }
  if (threadIdx.x == 0) {
    st_global(accept_len + b, best_len);
    st_global(best_beam + b, best);
    st_global(next_token + b, best_last);
  }
}

template <typename T, typename I>
cudaError_t launch(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                   int64_t B, int64_t W, int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                   int32_t* next_token, void* workspace, cudaStream_t stream) {
  const Plan p = make_plan(B * n_rows, V, sizeof(T));
  uint64_t* partial = static_cast<uint64_t*>(workspace);
  if (B * n_rows > 0) {
    const cudaError_t e = launch_kernel(
        "verify_greedy.argmax", argmax_kernel<T, I>, dim3(static_cast<unsigned>(B * n_rows * p.S)),
        dim3(kArgmaxThreads), (kArgmaxThreads / 32) * sizeof(uint64_t), stream, static_cast<const T*>(logits),
        n_rows, V, static_cast<const I*>(beam_node), W * L, p, partial);
    if (e != cudaSuccess) return e;
  }
  const int64_t threads = W < 32 ? 32 : W < kWalkThreads ? (W + 31) / 32 * 32 : kWalkThreads;
  return launch_kernel("verify_greedy.walk", walk_kernel<I>, dim3(static_cast<unsigned>(B)),
                       dim3(static_cast<unsigned>(threads)), 3 * 32 * sizeof(int32_t), stream,
                       static_cast<const uint64_t*>(partial), n_rows, p.S, static_cast<const I*>(beams),
                       static_cast<const I*>(beam_node), W, L, accept_len, best_beam, path_nodes, next_token);
}

template <typename T>
cudaError_t launch_t(IndexType it, const void* logits, int64_t n_rows, int64_t V, const void* beams,
                     const void* beam_node, int64_t B, int64_t W, int64_t L, int32_t* a, int32_t* bb, int32_t* p,
                     int32_t* nt, void* ws, cudaStream_t s) {
  if (it == IndexType::kInt64) {
    return launch<T, int64_t>(logits, n_rows, V, beams, beam_node, B, W, L, a, bb, p, nt, ws, s);
  }
  return launch<T, int32_t>(logits, n_rows, V, beams, beam_node, B, W, L, a, bb, p, nt, ws, s);
}

int64_t elem_bytes(FloatType t) { return t == FloatType::kFloat32 ? 4 : 2; }

}  // namespace

size_t verify_greedy_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, FloatType logits_type) {
  if (B < 1 || n_logit_rows < 1 || V < 1) return 8;
  const Plan p = make_plan(B * n_logit_rows, V, elem_bytes(logits_type));
  return static_cast<size_t>(B * n_logit_rows * p.S) * sizeof(uint64_t);
}

cudaError_t verify_greedy(const void* logits, FloatType logits_type, int64_t n_logit_rows, int64_t V,
                          const void* beams, const void* beam_node, IndexType index_type, int64_t B, int64_t W,
                          int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                          int32_t* next_token, void* workspace, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (W < 1 || L < 1 || V < 1 || V > 0x7fffffff || B > 0x7fffffff || n_logit_rows < 0 || workspace == nullptr ||
      B * n_logit_rows * make_plan(B * (n_logit_rows > 0 ? n_logit_rows : 1), V, elem_bytes(logits_type)).S > 0x7fffffff)
    return cudaErrorInvalidValue;
  switch (logits_type) {
    case FloatType::kFloat16:
      return launch_t<Half>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len, best_beam,
                            path_nodes, next_token, workspace, stream);
    case FloatType::kBFloat16:
      return launch_t<BFloat16>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len,
                                best_beam, path_nodes, next_token, workspace, stream);
    default:
      return launch_t<float>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len, best_beam,
                             path_nodes, next_token, workspace, stream);
  }
}

}  // namespace redrafter::cuda
