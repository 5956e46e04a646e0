// verify_sample: exact sampling by recursive rejection over the trie (docs/verify_sample_cuda_notes.md).
// One CTA per batch row. The walk over depths is sequential and block-uniform (every thread makes
// the same decisions from the same broadcast values); the V-wide work of each visited node is
// block-parallel: the processed distribution p (temperature, top-k by radix select on the logits'
// order keys, top-p by a search on the probabilities' bits) is written once per node into a
// float64 workspace row, children are tried against block sums of it, and the next token comes from
// an inverse-CDF scan over per-thread contiguous chunks. Arithmetic is float64 like the reference;
// only the order of the sums differs (block reductions instead of index-order sequential sums),
// which moves a decision only when a uniform lies within ~1e-15 (relative) of its threshold.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kThreads = 512;  // max threads per CTA (fewer for small V)

// Bit casts and uncontracted float64 arithmetic: nvcc would fuse x * inv_t - m into one FMA (a
// different rounding than the reference's two steps); the _rn intrinsics are never contracted.
#ifdef REDRAFTER_EMULATE
inline double bits_to_double(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
inline uint64_t double_to_bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
inline double mul_rn(double a, double b) { return a * b; }
inline double add_rn(double a, double b) { return a + b; }
inline double sub_rn(double a, double b) { return a - b; }
#else
__device__ __forceinline__ double bits_to_double(uint64_t u) {
  return __longlong_as_double(static_cast<long long>(u));
}
__device__ __forceinline__ uint64_t double_to_bits(double d) { return static_cast<uint64_t>(__double_as_longlong(d)); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
#endif

__device__ __forceinline__ double inf_d() { return bits_to_double(0x7ff0000000000000ull); }
__device__ __forceinline__ bool isnan_d(double x) { return x != x; }
// NaN-propagating max (torch.amax)
__device__ __forceinline__ double max_nan(double a, double b) { return (isnan_d(a) || a > b) ? a : b; }
// order key of a probability (>= 0 or NaN; NaN only when every p is NaN, then unused): its bits
__device__ __forceinline__ uint64_t prob_key(double p) { return p > 0.0 ? double_to_bits(p) : 0ull; }

// The float whose order_key (common.cuh) is k; NaN for the NaN key.
__device__ __forceinline__ float key_to_float(uint32_t k) {
  if (k == 0xffffffffu) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

struct Smem {
  double red[32];     // per-warp partials of the float64 reductions
  int64_t ired[32];   // per-warp partials of the integer reductions
  int hist[256];      // radix-select histogram
  int cnt[32];        // block_prefix_sum scratch
  int64_t pick;       // index chosen by one thread, broadcast
};

// Block-wide reductions: the result is the same in every thread (xor butterflies are symmetric,
// warps are combined in a fixed order), so decisions taken on it are block-uniform. Every thread
// must call them; they end with a barrier, so the scratch can be reused at once.
__device__ double block_sum(double v, Smem& s) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (lane_id() == 0) s.red[warp] = v;
  __syncthreads();
  double r = 0.0;
  for (unsigned w = 0; w < n_warps; ++w) r += s.red[w];
  __syncthreads();
  return r;
}

__device__ double block_max(double v, Smem& s) {
  for (int off = 16; off > 0; off >>= 1) v = max_nan(v, __shfl_xor_sync(kFullMask, v, off));
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (lane_id() == 0) s.red[warp] = v;
  __syncthreads();
  double r = s.red[0];
  for (unsigned w = 1; w < n_warps; ++w) r = max_nan(r, s.red[w]);
  __syncthreads();
  return r;
}

enum class IntOp { kSum, kMax, kMin };

template <IntOp kOp>
__device__ __forceinline__ int64_t int_op(int64_t a, int64_t b) {
  if (kOp == IntOp::kSum) return a + b;
  if (kOp == IntOp::kMax) return a > b ? a : b;
  return a < b ? a : b;
}

template <IntOp kOp>
__device__ int64_t block_reduce(int64_t v, Smem& s) {
  for (int off = 16; off > 0; off >>= 1) v = int_op<kOp>(v, __shfl_xor_sync(kFullMask, v, off));
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (lane_id() == 0) s.ired[warp] = v;
  __syncthreads();
  int64_t r = s.ired[0];
  for (unsigned w = 1; w < n_warps; ++w) r = int_op<kOp>(r, s.ired[w]);
  __syncthreads();
  return r;
}

// Exclusive prefix sum of v over the threads in threadIdx.x order.
__device__ double block_exclusive_scan(double v, Smem& s) {
  double incl = v;
  for (int d = 1; d < 32; d <<= 1) {
    const double o = __shfl_up_sync(kFullMask, incl, d);
    if (static_cast<int>(lane_id()) >= d) incl += o;
  }
  double excl = __shfl_up_sync(kFullMask, incl, 1);
  if (lane_id() == 0) excl = 0.0;
  const unsigned warp = threadIdx.x >> 5;
  if (lane_id() == 31) s.red[warp] = incl;
  __syncthreads();
  double before = 0.0;
  for (unsigned w = 0; w < warp; ++w) before += s.red[w];
  __syncthreads();
  return before + excl;
}

// This thread's contiguous chunk [lo, hi) of [0, V) (the scans walk chunks in index order).
__device__ __forceinline__ void chunk_of(int64_t V, int64_t* lo, int64_t* hi) {
  const int64_t n = (V + blockDim.x - 1) / blockDim.x;
  *lo = threadIdx.x * n < V ? threadIdx.x * n : V;
  *hi = *lo + n < V ? *lo + n : V;
}

// The k-th largest order_key of the row (1 <= k <= V; NaN ranks above everything, as in
// torch.topk): radix select, 8 bits per pass, from the most significant digit.
template <typename T>
__device__ uint32_t kth_largest_key(const T* __restrict__ row, int64_t V, int64_t k, Smem& s) {
  uint32_t prefix = 0, mask = 0;
  int64_t rem = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (unsigned i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
      const uint32_t key = order_key(to_float(row[v]));
      if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1);
    }
    __syncthreads();
    // every thread scans the histogram itself: the same digit everywhere, no broadcast needed
    int d = 255;
    for (; d > 0 && rem > s.hist[d]; --d) rem -= s.hist[d];
    __syncthreads();  // the histogram is cleared next pass
    prefix |= static_cast<uint32_t>(d) << shift;
    mask |= 255u << shift;
  }
  return prefix;
}

// top-p on p[0, V) (a distribution without NaN), in place: keep the smallest descending prefix
// (ties by index) whose mass reaches top_p, renormalise. The boundary value tau is the smallest p
// with S(> tau) < top_p, found by binary search on the bits of p (S(> k) is the block sum of the p
// whose bits exceed k, non-increasing in k); among the ties at tau the lowest indices are kept while
// the exclusive mass S(> tau) + j * tau stays below top_p.
__device__ void top_p_filter(double* __restrict__ p, int64_t V, double top_p, Smem& s) {
  int64_t kmax = 0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const int64_t k = static_cast<int64_t>(prob_key(p[v]));
    kmax = k > kmax ? k : kmax;
  }
  kmax = block_reduce<IntOp::kMax>(kmax, s);
  auto mass_above = [&](uint64_t key) {
    double part = 0.0;
    for (int64_t v = threadIdx.x; v < V; v += blockDim.x) part += prob_key(p[v]) > key ? p[v] : 0.0;
    return block_sum(part, s);
  };
  uint64_t lo = 0, hi = static_cast<uint64_t>(kmax);
  if (mass_above(0) < top_p) {
    hi = 0;  // every positive p is kept (rounding left the total below top_p)
  } else {
    // invariant: S(> lo) >= top_p > S(> hi), hi the key of an actual p. Each step splits (lo, hi]
    // at mid and snaps the bound it moves to an actual key: S only changes at actual keys, and
    // S(> mid) sums exactly the same terms as S(> k) for every k between mid and the nearest
    // actual key on that side (bitwise the same sum). The keys of p ~ exp(gaussian) are spread
    // ~gaussian in bit space, so this takes ~log2(V) + a few steps rather than a plain bisection's
    // ~62. Block-uniform.
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      double part = 0.0;
      int64_t above = static_cast<int64_t>(hi), below = static_cast<int64_t>(lo);
      for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
        const uint64_t k = prob_key(p[v]);
        if (k > mid) {
          part += p[v];
          if (k < static_cast<uint64_t>(above)) above = static_cast<int64_t>(k);  // min key in (mid, hi]
        } else if (k > lo && k > static_cast<uint64_t>(below)) {
          below = static_cast<int64_t>(k);  // max key in (lo, mid]
        }
      }
      const double sm = block_sum(part, s);
      above = block_reduce<IntOp::kMin>(above, s);
      below = block_reduce<IntOp::kMax>(below, s);
      if (sm < top_p) {
        // S(> below) == S(> mid) < top_p: the answer is in (lo, below]; below > lo because
        // S(> lo) >= top_p is the same sum when (lo, mid] holds no key (the guard never fires)
        if (static_cast<uint64_t>(below) == lo) break;
        hi = static_cast<uint64_t>(below);
      } else {
        lo = static_cast<uint64_t>(above) - 1;  // S(> above - 1) == S(> mid) >= top_p
      }
    }
  }
  const double s_hi = hi > 0 ? mass_above(hi) : 0.0;  // S(> tau), used only when tau > 0
  const uint64_t tau_key = hi;
  int64_t cut = V;  // ties at tau with an index <= cut are kept
  if (tau_key > 0) {
    const double tau = bits_to_double(tau_key);
    int64_t lo_c, hi_c;
    chunk_of(V, &lo_c, &hi_c);
    int ties = 0;
    for (int64_t v = lo_c; v < hi_c; ++v) ties += prob_key(p[v]) == tau_key;
    int n_ties = 0;
    const int before = block_prefix_sum(ties, s.cnt, &n_ties);
    // j = number of ties kept: the j-th (1-based) has exclusive mass S + (j-1) * tau < top_p
    auto keeps = [&](int64_t j) { return add_rn(s_hi, mul_rn(static_cast<double>(j - 1), tau)) < top_p; };
    const double est = ceil(sub_rn(top_p, s_hi) / tau);
    int64_t j = est >= static_cast<double>(n_ties) ? n_ties : (est < 1.0 ? 1 : static_cast<int64_t>(est));
    while (j > 1 && !keeps(j)) --j;
    while (j < n_ties && keeps(j + 1)) ++j;
    if (j < n_ties) {
      // the index of the j-th tie: found by the thread whose chunk holds it
      if (before < j && before + ties >= j) {
        int64_t seen = before;
        for (int64_t v = lo_c; v < hi_c; ++v) {
          if (prob_key(p[v]) == tau_key && ++seen == j) {
            s.pick = v;
            break;
          }
        }
      }
      __syncthreads();
      cut = s.pick;
      __syncthreads();
    }
  }
  double part = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const uint64_t k = prob_key(p[v]);
    if (!(k > tau_key || (k == tau_key && v <= cut))) p[v] = 0.0;
    part += p[v];
  }
  const double z = block_sum(part, s);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] = p[v] / z;
}

// p[0, V) = reference.sampling_probs of one logits row, then a barrier.
template <typename T>
__device__ void node_probs(const T* __restrict__ row, int64_t V, double inv_t, int64_t top_k, double top_p,
                           double* __restrict__ p, Smem& s) {
  const bool topk = top_k > 0 && top_k < V;
  // top-k: the k-th largest x is x of the k-th largest logit (x is a non-decreasing function of the
  // logit), so the selection runs on the logits' 32-bit order keys; NaN threshold keeps nothing
  const double thr = topk ? mul_rn(static_cast<double>(key_to_float(kth_largest_key(row, V, top_k, s))), inv_t)
                          : 0.0;
  auto x_at = [&](int64_t v) {
    const double x = mul_rn(static_cast<double>(to_float(row[v])), inv_t);
    return !topk || x >= thr ? x : -inf_d();
  };
  double m = -inf_d();
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) m = max_nan(m, x_at(v));
  m = block_max(m, s);
  double part = 0.0;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const double e = exp(sub_rn(x_at(v), m));
    p[v] = e;
    part += e;
  }
  const double z = block_sum(part, s);
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) p[v] = p[v] / z;  // this thread's own elements
  // a NaN anywhere makes z (and every p) NaN: top-p then changes nothing, as in the reference
  if (top_p < 1.0 && !isnan_d(z)) {
    __syncthreads();  // top_p_filter's chunks are other threads' elements
    top_p_filter(p, V, top_p, s);
  }
  __syncthreads();
}

// reference.sample_inverse_cdf over the residual p[0, V): the first index whose prefix sum exceeds
// u * total, clamped to the last positive p (0 when none). Prefix sums: sequential within each
// thread's chunk, chunks offset by a block scan; a zero-weight index is never returned.
__device__ int32_t inverse_cdf(const double* __restrict__ p, int64_t V, float u, Smem& s) {
  int64_t lo, hi;
  chunk_of(V, &lo, &hi);
  double local = 0.0;
  int64_t last = -1;
  for (int64_t v = lo; v < hi; ++v) {
    local += p[v];
    if (p[v] > 0.0) last = v;
  }
  const double start = block_exclusive_scan(local, s);
  const double total = block_max(add_rn(start, local), s);
  const int64_t last_pos = block_reduce<IntOp::kMax>(last, s);
  const double thr = mul_rn(static_cast<double>(u), total);
  int64_t first = V;
  double c = 0.0;
  for (int64_t v = lo; v < hi; ++v) {
    c += p[v];
    if (p[v] > 0.0 && add_rn(start, c) > thr) {
      first = v;
      break;
    }
  }
  first = block_reduce<IntOp::kMin>(first, s);
  const int64_t lp = last_pos < 0 ? 0 : last_pos;
  return static_cast<int32_t>(first < lp ? first : lp);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) verify_sample_kernel(
    const T* __restrict__ logits, int64_t n_rows, int64_t V, const I* __restrict__ beams,
    const I* __restrict__ beam_node, int64_t W, int64_t L, const float* __restrict__ accept_u,
    const float* __restrict__ sample_u, double inv_t, int64_t top_k, double top_p, double* __restrict__ workspace,
    int32_t* __restrict__ accept_len, int32_t* __restrict__ best_beam, int32_t* __restrict__ path_nodes,
    int32_t* __restrict__ next_token) {
  const int64_t b = blockIdx.x;
  Smem& s = *dynamic_smem<Smem>();
  double* p = workspace + b * V;  // the current node's (residual) distribution
  const T* rows = logits + b * n_rows * V;
  const I* beam = beams + b * W * L;
  const I* bn = beam_node + b * W * L;
  auto valid_node = [&](int64_t n) { return n >= 0 && n < n_rows; };
  int64_t cur = static_cast<int64_t>(bn[0]);
  int64_t a = 0;
  const bool root_ok = valid_node(cur);  // block-uniform, like every branch below
  if (root_ok) {
    node_probs(rows + cur * V, V, inv_t, top_k, top_p, p, s);
    for (int64_t d = 0; d + 1 < L; ++d) {
      int64_t child = -1, rank = 0;
      for (int64_t w = 0; w < W && child < 0; ++w) {
        if (static_cast<int64_t>(bn[w * L + d]) != cur) continue;
        const I c = bn[w * L + d + 1];
        bool seen = false;  // a lower beam already brought this child
        for (int64_t v = 0; v < w && !seen; ++v) seen = bn[v * L + d + 1] == c;
        if (seen) continue;
        const int64_t t = static_cast<int64_t>(beam[w * L + d + 1]);
        const double u = static_cast<double>(accept_u[(b * (L - 1) + d) * W + rank]);
        ++rank;
        // a child outside the logits or a token outside [0, V) is rejected without touching p
        const bool ok = valid_node(static_cast<int64_t>(c)) && t >= 0 && t < V;
        const double pt = ok ? p[t] : 0.0;  // read by every thread before the barriers below
        double part = 0.0;
        for (int64_t v = threadIdx.x; v < V; v += blockDim.x) part += p[v];
        const double mass = block_sum(part, s);
        if (ok && mul_rn(u, mass) < pt) {
          child = static_cast<int64_t>(c);
        } else {
          if (ok && threadIdx.x == 0) p[t] = 0.0;
          __syncthreads();
        }
      }
      if (child < 0) break;  // every child rejected: sample from the residual
      cur = child;
      ++a;
      node_probs(rows + cur * V, V, inv_t, top_k, top_p, p, s);
    }
  }
  const int32_t tok = root_ok ? inverse_cdf(p, V, sample_u[b], s) : -1;
  if (threadIdx.x != 0) return;  // no barrier follows
  int64_t best = 0;
  while (best < W - 1 && static_cast<int64_t>(bn[best * L + a]) != cur) ++best;
  accept_len[b] = static_cast<int32_t>(a);
  best_beam[b] = static_cast<int32_t>(best);
  for (int64_t i = 0; i < L; ++i) path_nodes[b * L + i] = i <= a ? static_cast<int32_t>(bn[best * L + i]) : -1;
  next_token[b] = tok;
}

template <typename T, typename I>
cudaError_t launch(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                   int64_t B, int64_t W, int64_t L, const float* accept_u, const float* sample_u, double inv_t,
                   int64_t top_k, double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                   int32_t* next_token, void* workspace, cudaStream_t stream) {
  const int64_t want = (V + 31) / 32 * 32;
  const unsigned threads = static_cast<unsigned>(want < kThreads ? want : kThreads);
  return launch_kernel(verify_sample_kernel<T, I>, dim3(static_cast<unsigned>(B)), dim3(threads), sizeof(Smem),
                       stream, static_cast<const T*>(logits), n_rows, V, static_cast<const I*>(beams),
                       static_cast<const I*>(beam_node), W, L, accept_u, sample_u, inv_t, top_k, top_p,
                       static_cast<double*>(workspace), accept_len, best_beam, path_nodes, next_token);
}

template <typename T>
cudaError_t launch_t(IndexType it, const void* logits, int64_t n_rows, int64_t V, const void* beams,
                     const void* beam_node, int64_t B, int64_t W, int64_t L, const float* au, const float* su,
                     double inv_t, int64_t top_k, double top_p, int32_t* a, int32_t* bb, int32_t* pn, int32_t* nt,
                     void* ws, cudaStream_t s) {
  if (it == IndexType::kInt64)
    return launch<T, int64_t>(logits, n_rows, V, beams, beam_node, B, W, L, au, su, inv_t, top_k, top_p, a, bb, pn,
                              nt, ws, s);
  return launch<T, int32_t>(logits, n_rows, V, beams, beam_node, B, W, L, au, su, inv_t, top_k, top_p, a, bb, pn, nt,
                            ws, s);
}

}  // namespace

size_t verify_sample_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, FloatType logits_type,
                                     double temperature) {
  if (temperature == 0.0) return verify_greedy_workspace_bytes(B, n_logit_rows, V, logits_type);
  return static_cast<size_t>(B > 0 ? B : 0) * static_cast<size_t>(V > 0 ? V : 0) * sizeof(double);
}

cudaError_t verify_sample(const void* logits, FloatType logits_type, int64_t n_logit_rows, int64_t V,
                          const void* beams, const void* beam_node, IndexType index_type, int64_t B, int64_t W,
                          int64_t L, const float* accept_u, const float* sample_u, double temperature, int64_t top_k,
                          double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                          int32_t* next_token, void* workspace, cudaStream_t stream) {
  if (temperature == 0.0) {  // greedy, exactly (the uniforms are unused)
    return verify_greedy(logits, logits_type, n_logit_rows, V, beams, beam_node, index_type, B, W, L, accept_len,
                         best_beam, path_nodes, next_token, workspace, stream);
  }
  if (B == 0) return cudaSuccess;
  if (W < 1 || L < 1 || V < 1 || B > 0x7fffffff || !(temperature > 0.0) || !(top_p > 0.0 && top_p <= 1.0) ||
      top_k < 0 || workspace == nullptr)
    return cudaErrorInvalidValue;
  const double inv_t = 1.0 / temperature;  // as the reference: one reciprocal, then a multiply per logit
  switch (logits_type) {
    case FloatType::kFloat16:
      return launch_t<Half>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u, inv_t,
                            top_k, top_p, accept_len, best_beam, path_nodes, next_token, workspace, stream);
    case FloatType::kBFloat16:
      return launch_t<BFloat16>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u,
                                inv_t, top_k, top_p, accept_len, best_beam, path_nodes, next_token, workspace, stream);
    default:
      return launch_t<float>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u, inv_t,
                             top_k, top_p, accept_len, best_beam, path_nodes, next_token, workspace, stream);
  }
}

}  // namespace redrafter::cuda
