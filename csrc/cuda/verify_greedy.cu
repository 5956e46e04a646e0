// verify_greedy: one CTA per batch row, one warp per beam (warps take beams w, w + n_warps, ...).
// A warp walks its beam from the root: argmax over V of the node's logits (lanes stride over V,
// then a shuffle reduction; first maximum on ties, a NaN is the maximum like torch.argmax), and
// goes one level deeper while the draft token equals it. The argmax at the node where it stops is
// the beam's next token. Then warp 0 picks the longest beam (lowest index on ties) and writes the
// path. Beams on a common greedy path recompute the same argmaxes (the rows come from L2).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kMaxWarps = 32;

// torch.argmax order: a before b when a is NaN (the first NaN wins) or larger, equal -> lower index
__device__ __forceinline__ bool argmax_before(float a, int64_t ia, float b, int64_t ib) {
  if (is_nan(a)) return !is_nan(b) || ia < ib;
  if (is_nan(b)) return false;
  return a > b || (a == b && ia < ib);
}

template <typename T>
__device__ int32_t warp_argmax(const T* __restrict__ row, int64_t V) {
  float best = -__int_as_float(0x7f800000);  // -inf
  int64_t best_i = V;                         // sentinel: loses to every real element
  for (int64_t v = lane_id(); v < V; v += 32) {
    const float x = to_float(row[v]);
    if (argmax_before(x, v, best, best_i)) {
      best = x;
      best_i = v;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float ob = __shfl_xor_sync(kFullMask, best, off);
    const int64_t oi = __shfl_xor_sync(kFullMask, best_i, off);
    if (argmax_before(ob, oi, best, best_i)) {
      best = ob;
      best_i = oi;
    }
  }
  return static_cast<int32_t>(best_i);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kMaxWarps * 32) verify_greedy_kernel(const T* __restrict__ logits, int64_t n_rows, int64_t V,
                                     const I* __restrict__ beams, const I* __restrict__ beam_node, int64_t W,
                                     int64_t L, int32_t* __restrict__ accept_len, int32_t* __restrict__ best_beam,
                                     int32_t* __restrict__ path_nodes, int32_t* __restrict__ next_token) {
  const int64_t b = blockIdx.x;
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  int32_t* acc = dynamic_smem<int32_t>();  // [W] accepted length per beam
  int32_t* last = acc + W;                 // [W] argmax where the beam stops
  for (int64_t w = warp; w < W; w += n_warps) {
    const I* t = beams + (b * W + w) * L;
    const I* nw = beam_node + (b * W + w) * L;
    int64_t len = 0;
    int32_t target = -1;
    while (true) {
      const int64_t node = static_cast<int64_t>(nw[len]);
      // warp-uniform: every lane reads the same node
      target = node >= 0 && node < n_rows ? warp_argmax(logits + (b * n_rows + node) * V, V) : -1;
      if (len == L - 1 || target < 0 || static_cast<int64_t>(t[len + 1]) != target) break;
      ++len;
    }
    if (lane_id() == 0) {
      acc[w] = static_cast<int32_t>(len);
      last[w] = target;
    }
  }
  __syncthreads();
  if (warp != 0) return;  // no barrier follows
  int32_t best_len = -1;
  int64_t best = W;
  for (int64_t w = lane_id(); w < W; w += 32) {
    if (acc[w] > best_len) {  // strict: a lane sees its beams in increasing order
      best_len = acc[w];
      best = w;
    }
  }
  for (int off = 16; off > 0; off >>= 1) {
    const int32_t ol = __shfl_xor_sync(kFullMask, best_len, off);
    const int64_t ob = __shfl_xor_sync(kFullMask, best, off);
    if (ol > best_len || (ol == best_len && ob < best)) {
      best_len = ol;
      best = ob;
    }
  }
  const I* path = beam_node + (b * W + best) * L;
  for (int64_t i = lane_id(); i < L; i += 32) {
    path_nodes[b * L + i] = i <= best_len ? static_cast<int32_t>(path[i]) : -1;
  }
  if (lane_id() == 0) {
    accept_len[b] = best_len;
    best_beam[b] = static_cast<int32_t>(best);
    next_token[b] = last[best];
  }
}

template <typename T, typename I>
cudaError_t launch(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                   int64_t B, int64_t W, int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                   int32_t* next_token, cudaStream_t stream) {
  const int64_t warps = W < kMaxWarps ? W : kMaxWarps;
  return launch_kernel(verify_greedy_kernel<T, I>, dim3(static_cast<unsigned>(B)), dim3(static_cast<unsigned>(warps * 32)),
                       static_cast<size_t>(2 * W * sizeof(int32_t)), stream, static_cast<const T*>(logits), n_rows, V,
                       static_cast<const I*>(beams), static_cast<const I*>(beam_node), W, L, accept_len, best_beam,
                       path_nodes, next_token);
}

template <typename T>
cudaError_t launch_t(IndexType it, const void* logits, int64_t n_rows, int64_t V, const void* beams,
                     const void* beam_node, int64_t B, int64_t W, int64_t L, int32_t* a, int32_t* bb, int32_t* p,
                     int32_t* nt, cudaStream_t s) {
  if (it == IndexType::kInt64) return launch<T, int64_t>(logits, n_rows, V, beams, beam_node, B, W, L, a, bb, p, nt, s);
  return launch<T, int32_t>(logits, n_rows, V, beams, beam_node, B, W, L, a, bb, p, nt, s);
}

}  // namespace

cudaError_t verify_greedy(const void* logits, FloatType logits_type, int64_t n_logit_rows, int64_t V,
                          const void* beams, const void* beam_node, IndexType index_type, int64_t B, int64_t W,
                          int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                          int32_t* next_token, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (W < 1 || L < 1 || V < 1 || B > 0x7fffffff) return cudaErrorInvalidValue;
  switch (logits_type) {
    case FloatType::kFloat16:
      return launch_t<Half>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len, best_beam,
                            path_nodes, next_token, stream);
    case FloatType::kBFloat16:
      return launch_t<BFloat16>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len,
                                best_beam, path_nodes, next_token, stream);
    default:
      return launch_t<float>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_len, best_beam,
                             path_nodes, next_token, stream);
  }
}

}  // namespace redrafter::cuda
