// verify_greedy, two strategies (both exact, the same results):
// Per node (small inputs, 2 launches):
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
// Lazy (when the logits exceed ~16 MB per depth, 2L launches): only the nodes that beams still
// matching the target reach are argmaxed, depth by depth (below). Bound: the accepted path's
// rows, (accept_len + 1) per batch row.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kArgmaxThreads = 256;
constexpr int kWalkThreads = 256;
constexpr int64_t kTargetCtas = 264;  // 2 waves on a 132-SM GPU
constexpr int64_t kMinChunkBytes = 16 * 1024;
constexpr int64_t kMinLazyChunkBytes = 2 * 1024;
constexpr int64_t kLazyBytesPerDepth = 16 << 20;

struct Plan {
  int64_t S, chunk;  // splits per row, elements per split (a multiple of 8)
};

// Splits of a row of V elements so that rows * S reaches kTargetCtas CTAs, each split at least
// min_bytes and a multiple of 8 elements (16-byte loads); both strategies size their grids so.
inline Plan split_plan(int64_t rows, int64_t V, int64_t elem_bytes, int64_t min_bytes) {
  const int64_t min_chunk = min_bytes / elem_bytes;
  int64_t S = (kTargetCtas + rows - 1) / rows;
  const int64_t max_s = (V + min_chunk - 1) / min_chunk;
  S = S < max_s ? S : max_s;
  S = S < 1 ? 1 : S;
  int64_t chunk = (V + S - 1) / S;
  chunk = (chunk + 7) / 8 * 8;
  return {(V + chunk - 1) / chunk, chunk};
}

inline Plan make_plan(int64_t rows, int64_t V, int64_t elem_bytes) {
  return split_plan(rows, V, elem_bytes, kMinChunkBytes);
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

// Block reduction of each thread's best (length, beam, argmax) to the longest, lowest beam, and the
// row's outputs. Every thread of the block calls it.
template <typename I>
__device__ void finish_row(int64_t b, int64_t W, int64_t L, const I* __restrict__ beam_node, int32_t best_len,
                           int32_t best, int32_t best_last, int32_t* __restrict__ accept_len,
                           int32_t* __restrict__ best_beam, int32_t* __restrict__ path_nodes,
                           int32_t* __restrict__ next_token) {
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
  finish_row(b, W, L, beam_node, best_len, best, best_last, accept_len, best_beam, path_nodes, next_token);
}

// ---- lazy strategy: argmax only at the nodes the still-matching beams reach, depth by depth ------
// Per depth d, launch A (grid B x S) finds the distinct nodes at position d of the beams still
// matching ("slots"; one in a well-formed trie: the greedy path is unique) and computes their split
// argmax; launch B (grid B) advances every beam: it stops at d when d == L-1 or the draft token
// differs from the argmax there. The last launch B also picks the best beam.

struct Lazy {
  int64_t S, chunk;
  uint64_t* keys;    // [B, W, S] split argmax keys of each slot
  int32_t* slot_of;  // [B, W] slot of each beam's node at the current depth
  int32_t* alive;    // [B, W] beam still matching (read from depth 1 on)
  int32_t* len;      // [B, W] accepted length of a stopped beam
  int32_t* last;     // [B, W] argmax where it stopped
};

inline Lazy make_lazy(int64_t B, int64_t W, int64_t V, int64_t elem_bytes, void* ws) {
  const Plan p = split_plan(B, V, elem_bytes, kMinLazyChunkBytes);
  Lazy z{p.S, p.chunk, nullptr, nullptr, nullptr, nullptr, nullptr};
  char* c = static_cast<char*>(ws);
  z.keys = reinterpret_cast<uint64_t*>(c);
  c = c ? c + B * W * z.S * 8 : nullptr;
  z.slot_of = reinterpret_cast<int32_t*>(c);
  z.alive = z.slot_of ? z.slot_of + B * W : nullptr;
  z.len = z.alive ? z.alive + B * W : nullptr;
  z.last = z.len ? z.len + B * W : nullptr;
  return z;
}

inline size_t lazy_bytes(int64_t B, int64_t W, const Lazy& z) { return static_cast<size_t>(B * W * (z.S * 8 + 16)); }

template <typename T, typename I>
__global__ void __launch_bounds__(kArgmaxThreads)
    lazy_argmax_kernel(const T* __restrict__ logits, int64_t n_rows, int64_t V, const I* __restrict__ beam_node,
                       int64_t W, int64_t L, int64_t d, Lazy z) {
  const int64_t b = blockIdx.x, s = blockIdx.y;
  int* sm = dynamic_smem<int>();
  int* scratch = sm;                                            // [32] block_prefix_count
  uint64_t* red = reinterpret_cast<uint64_t*>(sm + 34);         // [32] (8-byte aligned)
  int64_t* node = reinterpret_cast<int64_t*>(red + 32);         // [W] node of beam w (alive), else -2^63
  int64_t* slot_node = node + W;                                // [W]
  int32_t* first = reinterpret_cast<int32_t*>(slot_node + W);   // [W] slot of a first beam, else -1
  constexpr int64_t kDead = INT64_MIN;
  for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {
    const bool alive = d == 0 || ld_global(z.alive + b * W + w) != 0;
    node[w] = alive ? static_cast<int64_t>(ld_global(beam_node + (b * W + w) * L + d)) : kDead;
  }
  __syncthreads();
  // slots: the distinct nodes of the alive beams, numbered in order of their lowest beam
  int n_slots = 0;
  for (int64_t w0 = 0; w0 < W; w0 += blockDim.x) {
    const int64_t w = w0 + threadIdx.x;
    bool is_first = w < W && node[w] != kDead;
    for (int64_t v = 0; is_first && v < w; ++v) is_first = node[v] != node[w];
    int total = 0;
    const int before = block_prefix_count(is_first, scratch, &total);
    if (w < W) {
      first[w] = is_first ? n_slots + before : -1;
      if (is_first) slot_node[n_slots + before] = node[w];
    }
    n_slots += total;
  }
  __syncthreads();
  if (s == 0) {  // each beam's slot, for the advance
    for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {
      int32_t j = -1;
      if (node[w] != kDead) {
        int64_t v = 0;
        while (node[v] != node[w]) ++v;  // the lowest beam with this node holds its slot
        j = first[v];
      }
      st_global(z.slot_of + b * W + w, j);
    }
  }
  const int64_t lo = s * z.chunk, hi = lo + z.chunk < V ? lo + z.chunk : V;
  for (int j = 0; j < n_slots; ++j) {  // block-uniform
    const int64_t nd = slot_node[j];
    if (nd < 0 || nd >= n_rows) continue;  // out of range: the advance takes argmax -1
    uint64_t best = 0;
    block_for_each(logits + (b * n_rows + nd) * V, lo, hi, [&](int64_t i, float x) { best = max_u64(best, pack(x, i)); });
    for (int off = 16; off > 0; off >>= 1) best = max_u64(best, __shfl_xor_sync(kFullMask, best, off));
    if (lane_id() == 0) red[threadIdx.x >> 5] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (unsigned w = 1; w < (blockDim.x >> 5); ++w) best = max_u64(best, red[w]);
      st_global(z.keys + (b * W + j) * z.S + s, best);
    }
    __syncthreads();  // red is reused by the next slot
  }
}

template <typename I>
__global__ void __launch_bounds__(kWalkThreads)
    lazy_advance_kernel(int64_t n_rows, const I* __restrict__ beams, const I* __restrict__ beam_node, int64_t W,
                        int64_t L, int64_t d, Lazy z, int32_t* __restrict__ accept_len,
                        int32_t* __restrict__ best_beam, int32_t* __restrict__ path_nodes,
                        int32_t* __restrict__ next_token) {
  const int64_t b = blockIdx.x;
  for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {
    if (d > 0 && ld_global(z.alive + b * W + w) == 0) continue;
    const int64_t nd = static_cast<int64_t>(ld_global(beam_node + (b * W + w) * L + d));
    int32_t tgt = -1;
    if (nd >= 0 && nd < n_rows) {
      const int64_t j = ld_global(z.slot_of + b * W + w);
      uint64_t k = 0;
      for (int64_t s = 0; s < z.S; ++s) k = max_u64(k, ld_global(z.keys + (b * W + j) * z.S + s));
      tgt = static_cast<int32_t>(0xffffffffu - static_cast<uint32_t>(k));
    }
    const bool stop = d == L - 1 || tgt < 0 || static_cast<int64_t>(ld_global(beams + (b * W + w) * L + d + 1)) != tgt;
    if (stop) {
      st_global(z.len + b * W + w, static_cast<int32_t>(d));
      st_global(z.last + b * W + w, tgt);
    }
    if (stop || d == 0) st_global(z.alive + b * W + w, static_cast<int32_t>(!stop));
  }
  if (d != L - 1) return;  // block-uniform: the last depth picks the best beam
  __syncthreads();          // this thread's beams' len/last were written above; others' too
  int32_t best_len = -1, best = static_cast<int32_t>(W), best_last = -1;
  for (int64_t w = threadIdx.x; w < W; w += blockDim.x) {
    const int32_t l = ld_global(z.len + b * W + w);
    if (l > best_len) {
      best_len = l;
      best = static_cast<int32_t>(w);
      best_last = ld_global(z.last + b * W + w);
    }
  }
  finish_row(b, W, L, beam_node, best_len, best, best_last, accept_len, best_beam, path_nodes, next_token);
}

int g_strategy = 0;  // verify_greedy_set_strategy

// Lazy when reading every referenced node would cost more than the 2L launches of the lazy walk
// (~2 us each): about 16 MB of logits per depth at 4.3 TB/s.
inline bool use_lazy(int64_t B, int64_t n_rows, int64_t V, int64_t L, int64_t elem_bytes) {
  if (g_strategy != 0) return g_strategy == 2;
  return B * n_rows * V * elem_bytes > L * kLazyBytesPerDepth;
}

template <typename T, typename I>
cudaError_t launch_lazy(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                        int64_t B, int64_t W, int64_t L, int32_t* accept_len, int32_t* best_beam,
                        int32_t* path_nodes, int32_t* next_token, void* workspace, cudaStream_t stream) {
  const Lazy z = make_lazy(B, W, V, sizeof(T), workspace);
  const size_t smem = 34 * 4 + 32 * 8 + W * 20 + 16;
  const int64_t threads = W < 32 ? 32 : W < kWalkThreads ? (W + 31) / 32 * 32 : kWalkThreads;
  for (int64_t d = 0; d < L; ++d) {
    cudaError_t e = launch_kernel("verify_greedy.lazy_argmax", lazy_argmax_kernel<T, I>,
                                  dim3(static_cast<unsigned>(B), static_cast<unsigned>(z.S)), dim3(kArgmaxThreads), smem, stream,
                                  static_cast<const T*>(logits), n_rows, V, static_cast<const I*>(beam_node), W, L,
                                  d, z);
    if (e != cudaSuccess) return e;
    e = launch_kernel("verify_greedy.lazy_advance", lazy_advance_kernel<I>, dim3(static_cast<unsigned>(B)),
                      dim3(static_cast<unsigned>(threads)), 3 * 32 * sizeof(int32_t), stream, n_rows,
                      static_cast<const I*>(beams), static_cast<const I*>(beam_node), W, L, d, z, accept_len,
                      best_beam, path_nodes, next_token);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

template <typename T, typename I>
cudaError_t launch(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                   int64_t B, int64_t W, int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                   int32_t* next_token, void* workspace, cudaStream_t stream) {
  if (use_lazy(B, n_rows, V, L, sizeof(T))) {
    return launch_lazy<T, I>(logits, n_rows, V, beams, beam_node, B, W, L, accept_len, best_beam, path_nodes,
                             next_token, workspace, stream);
  }
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

size_t verify_greedy_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, int64_t W, FloatType logits_type) {
  if (B < 1 || n_logit_rows < 1 || V < 1 || W < 1) return 8;
  const Plan p = make_plan(B * n_logit_rows, V, elem_bytes(logits_type));
  const size_t per_node = static_cast<size_t>(B * n_logit_rows * p.S) * sizeof(uint64_t);
  const size_t lazy = lazy_bytes(B, W, make_lazy(B, W, V, elem_bytes(logits_type), nullptr));
  return per_node > lazy ? per_node : lazy;  // either strategy fits
}

void verify_greedy_set_strategy(int strategy) { g_strategy = strategy; }

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
