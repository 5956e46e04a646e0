// verify_sample: exact sampling by recursive rejection over the trie (docs/verify_sample_cuda_notes.md).
// One CTA per batch row. The walk over depths is sequential and block-uniform (every thread makes
// the same decisions from the same broadcast values); the V-wide work of each visited node is
// block-parallel and never materialises p: one pass over the logits (16-byte loads) gives the max
// and the sum of exp(x - max), and p(v) is recomputed from the logit wherever needed. With top-k /
// top-p the same pass keeps each thread's largest logits in shared memory, where the filters are
// cut exactly and the kept set serves the node's final sample (a multi-pass general path decides
// when they cannot); without filters it keeps per-tile sums so that the final inverse-CDF scan
// starts at the crossing's tile. A child is tried against its drafted token's p alone: the
// remaining mass starts at 1 and drops by each rejected p(t) (summed again only when the
// subtraction cancels > 10 bits). Arithmetic is float64 like the reference; only the order and
// grouping of the sums differ, which moves a decision only when a uniform lies within ~1e-13
// (relative) of its threshold.
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
  double bval[2];     // values read by thread 0, broadcast
  int32_t n_rej;      // rejected children at the current node
};
// followed in dynamic shared memory by: int64_t nodes[W*L], toks[W*L] (when staged), the rejected
// tokens int64_t rej[W], and a bitmap of rejected tokens uint32_t bits[ceil(V/32)] (when V <= kMaxBitmapV)

constexpr int64_t kMaxBitmapV = 1 << 18;   // 32 KB of bits
constexpr int64_t kMaxStagedBytes = 96 * 1024;

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

// Exclusive prefix sum of v over the threads in threadIdx.x order, and the block total (the last
// thread's inclusive sum: the same additions as the prefixes).
__device__ double block_exclusive_scan(double v, Smem& s, double* total) {
  double incl = v;
  for (int d = 1; d < 32; d <<= 1) {
    const double o = __shfl_up_sync(kFullMask, incl, d);
    if (static_cast<int>(lane_id()) >= d) incl += o;
  }
  double excl = __shfl_up_sync(kFullMask, incl, 1);
  if (lane_id() == 0) excl = 0.0;
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  if (lane_id() == 31) s.red[warp] = incl;
  __syncthreads();
  double before = 0.0, all = 0.0;
  for (unsigned w = 0; w < n_warps; ++w) {
    before += w < warp ? s.red[w] : 0.0;
    all = w == 0 ? s.red[0] : all + s.red[w];
  }
  __syncthreads();
  *total = all;
  return before + excl;
}

// This thread's contiguous chunk [lo, hi) of [0, n) (index-order scans).
__device__ __forceinline__ void chunk_of(int64_t n, int64_t* lo, int64_t* hi) {
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  *lo = threadIdx.x * per < n ? threadIdx.x * per : n;
  *hi = *lo + per < n ? *lo + per : n;
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
    block_for_each(row, 0, V, [&](int64_t, float x) {
      const uint32_t key = order_key(x);
      if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1);
    });
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

// A node's distribution, never materialised: p(v) is recomputed from the logit when needed, with
// the reference's operations (so the same v always gives the same bits). Block-uniform values.
struct Dist {
  double inv_t = 1.0;
  bool topk = false;
  double thr_x = 0.0;     // top-k: x kept iff x >= thr_x
  double m = 0.0, z = 1.0;
  bool nan = false;       // every p is NaN (a NaN or +inf logit, all -inf, NaN top-k threshold)
  bool filt = false;      // top-p applied: kept iff key > tau or (key == tau and v <= cut), then / z2
  uint64_t tau = 0;
  int64_t cut = 0;
  double z2 = 1.0;
};

// Per-tile sums of an unfiltered node's pass, so that its final sample re-reads one tile of the row
// instead of the row up to the crossing. Tile j holds the elements i with (i - vlo) >> sh == j
// (vlo: the row's first 16-byte boundary; the head goes to tile 0, the rest past nt to the last).
struct Tiles {
  double* part = nullptr;  // [nt * blockDim]: thread t's sum of exp(x - tmax[t]) over tile j at j * blockDim + t
  double* tmax = nullptr;  // [blockDim] each thread's running max at the end of the pass
  double* mass = nullptr;  // [nt] tile masses in p units at the stop node
  int nt = 0;              // 0: not recorded
  int sh = 0;
};

template <typename T>
__device__ __forceinline__ int64_t row_head(const T* row, int64_t V) {  // as block_for_each's head
  constexpr int64_t E = 16 / static_cast<int64_t>(sizeof(T));
  const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(row) & 15u) / sizeof(T));
  const int64_t head = mis == 0 ? 0 : E - mis;
  return head < V ? head : V;
}

__device__ __forceinline__ int tile_of(const Tiles& tl, int64_t i, int64_t vlo) {
  if (i < vlo) return 0;
  const int64_t j = (i - vlo) >> tl.sh;
  return j < tl.nt ? static_cast<int>(j) : tl.nt - 1;
}

// p before top-p (step 3 of reference.sampling_probs)
__device__ __forceinline__ double base_prob(const Dist& d, float logit) {
  if (d.nan) return bits_to_double(0x7ff8000000000000ull);
  const double x = mul_rn(static_cast<double>(logit), d.inv_t);
  if (d.topk && !(x >= d.thr_x)) return 0.0;
  return exp(sub_rn(x, d.m)) / d.z;
}

__device__ __forceinline__ double prob(const Dist& d, float logit, int64_t v) {
  double p = base_prob(d, logit);
  if (d.filt) {
    const uint64_t k = prob_key(p);
    p = (k > d.tau || (k == d.tau && v <= d.cut)) ? p / d.z2 : 0.0;
  }
  return p;
}

// top-p on the distribution d (no NaN): the boundary key tau is the smallest p with
// S(> tau) < top_p, found by a search on the bits of p (S(> k): block sum of the p whose bits
// exceed k, non-increasing in k); among the ties at tau the lowest indices are kept while the
// exclusive mass S(> tau) + j * tau stays below top_p; then z2 = the kept mass.
template <typename T>
__device__ void top_p_filter(const T* __restrict__ row, int64_t V, double top_p, Dist& d, Smem& s) {
  const uint64_t kmax = prob_key(1.0 / d.z);  // the largest p: base_prob at x == m is exp(0) / z
  auto mass_above = [&](uint64_t key) {
    double part = 0.0;
    block_for_each(row, 0, V, [&](int64_t, float x) {
      const double p = base_prob(d, x);
      part += prob_key(p) > key ? p : 0.0;
    });
    return block_sum(part, s);
  };
  uint64_t lo = 0, hi = kmax;
  if (mass_above(0) < top_p) {
    hi = 0;  // every positive p is kept (rounding left the total below top_p)
  } else {
    // invariant: S(> lo) >= top_p > S(> hi), hi the key of an actual p. Each step splits (lo, hi]
    // at mid and snaps the bound it moves to an actual key (S only changes at actual keys), so
    // softmax-like rows take ~log2(V) + a few steps rather than a plain bisection's ~62.
    while (hi - lo > 1) {
      const uint64_t mid = lo + (hi - lo) / 2;
      double part = 0.0;
      int64_t above = static_cast<int64_t>(hi), below = static_cast<int64_t>(lo);
      block_for_each(row, 0, V, [&](int64_t, float x) {
        const double p = base_prob(d, x);
        const uint64_t k = prob_key(p);
        if (k > mid) {
          part += p;
          if (k < static_cast<uint64_t>(above)) above = static_cast<int64_t>(k);  // min key in (mid, hi]
        } else if (k > lo && k > static_cast<uint64_t>(below)) {
          below = static_cast<int64_t>(k);  // max key in (lo, mid]
        }
      });
      const double sm = block_sum(part, s);
      above = block_reduce<IntOp::kMin>(above, s);
      below = block_reduce<IntOp::kMax>(below, s);
      if (sm < top_p) {
        if (static_cast<uint64_t>(below) == lo) break;  // never fires: S(> lo) >= top_p
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
    for (int64_t v = lo_c; v < hi_c; ++v) ties += prob_key(base_prob(d, to_float(ld_global(row + v)))) == tau_key;
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
          if (prob_key(base_prob(d, to_float(ld_global(row + v)))) == tau_key && ++seen == j) {
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
  d.tau = tau_key;
  d.cut = cut;
  // the kept mass, by which the reference renormalises
  double part = 0.0;
  block_for_each(row, 0, V, [&](int64_t v, float x) {
    const double p = base_prob(d, x);
    const uint64_t k = prob_key(p);
    part += (k > tau_key || (k == tau_key && v <= cut)) ? p : 0.0;
  });
  d.z2 = block_sum(part, s);
  d.filt = true;
}

// Block max of the per-thread maxima tm (no NaN among them) and the sum of the per-thread sums tz
// of exp(x - tm) rescaled to it; nan: some thread saw a kept NaN. Every thread must call it.
__device__ void finish_max_sum(double tm, double tz, bool any_nan, Smem& s, double* m_out, double* z_out,
                               bool* nan_out) {
  double m = tm;
  for (int off = 16; off > 0; off >>= 1) {
    const double o = __shfl_xor_sync(kFullMask, m, off);
    m = o > m ? o : m;
  }
  if (lane_id() == 0) s.red[threadIdx.x >> 5] = m;
  *nan_out = __syncthreads_or(any_nan);
  m = -inf_d();
  for (unsigned w = 0; w < (blockDim.x >> 5); ++w) m = s.red[w] > m ? s.red[w] : m;
  __syncthreads();
  *z_out = block_sum(tm > -inf_d() && m < inf_d() ? tz * exp(sub_rn(tm, m)) : 0.0, s);
  *m_out = m;
}

// Online max / sum of exp(x - max) of one thread: the running max tm of the x seen and the sum tz
// of exp(x - tm), rescaled when tm grows.
__device__ __forceinline__ void online_add(double x, double& tm, double& tz, bool& any_nan) {
  if (isnan_d(x)) {
    any_nan = true;
  } else if (x > tm) {
    tz = (tm == -inf_d() ? 0.0 : tz * exp(sub_rn(tm, x))) + 1.0;
    tm = x;
  } else if (x > -inf_d()) {
    tz += exp(sub_rn(x, tm));
  }
}

// reference.sampling_probs of one logits row, as a Dist, by passes over the row: 4 radix passes
// with top-k, one for the max and the sum of exp(x - max), and the top-p search passes with top-p.
// The general path, taken when the one-pass filter below cannot decide.
template <typename T>
__device__ __noinline__ Dist node_dist(const T* __restrict__ row, int64_t V, double inv_t, int64_t top_k, double top_p, Smem& s,
                          const Tiles& tl) {
  Dist d;
  d.inv_t = inv_t;
  d.topk = top_k > 0 && top_k < V;
  // top-k: the k-th largest x is x of the k-th largest logit (x is a non-decreasing function of
  // the logit), so the selection runs on the logits' 32-bit order keys; a NaN threshold keeps nothing
  d.thr_x = d.topk ? mul_rn(static_cast<double>(key_to_float(kth_largest_key(row, V, top_k, s))), inv_t) : 0.0;
  const Dist& cd = d;
  double tm = -inf_d(), tz = 0.0;  // this thread's running max of the kept x and sum of exp(x - tm)
  bool any_nan = false;
  if (tl.nt > 0) {  // unfiltered: the same sums, and each tile's share of this thread's
    double* mine = tl.part + threadIdx.x;
    for (int j = 0; j < tl.nt; ++j) mine[j * blockDim.x] = 0.0;
    const int64_t vlo = row_head(row, V);
    block_for_each(row, 0, V, [&](int64_t i, float logit) {
      const double x = mul_rn(static_cast<double>(logit), cd.inv_t);
      double* slot = mine + tile_of(tl, i, vlo) * blockDim.x;
      if (isnan_d(x)) {
        any_nan = true;
      } else if (x > tm) {
        if (tm == -inf_d()) {
          tz = 1.0;
        } else {
          const double r = exp(sub_rn(tm, x));
          tz = tz * r + 1.0;
          for (int j = 0; j < tl.nt; ++j) mine[j * blockDim.x] *= r;
        }
        *slot += 1.0;
        tm = x;
      } else if (x > -inf_d()) {
        const double e = exp(sub_rn(x, tm));
        tz += e;
        *slot += e;
      }
    });
    tl.tmax[threadIdx.x] = tm;
  } else {
    block_for_each(row, 0, V, [&](int64_t, float logit) {
      const double x = mul_rn(static_cast<double>(logit), cd.inv_t);
      if (!(cd.topk && !(x >= cd.thr_x))) online_add(x, tm, tz, any_nan);  // top-k removes a NaN too
    });
  }
  bool nan = false;
  finish_max_sum(tm, tz, any_nan, s, &d.m, &d.z, &nan);
  // NaN logit, +inf (inf - inf), all removed or -inf (-inf - -inf): every p is NaN in the reference
  d.nan = nan || !(d.m > -inf_d() && d.m < inf_d()) || isnan_d(d.thr_x);
  if (top_p < 1.0 && !d.nan) top_p_filter(row, V, top_p, d, s);
  return d;
}

// ---- one-pass filter: the node's row is read once; top-k / top-p are decided in shared memory ----
// During the max / sum pass each thread keeps its R largest (order key, index) pairs in shared
// memory. Every element whose key exceeds tk (the largest list minimum of the threads that dropped
// one) is then in some list: those candidates are compacted and sorted by (key desc, index asc),
// which is the reference's (p desc, index asc) order wherever p differs between keys. Top-k and
// top-p are cut there exactly; the kept set stays in shared memory for the node's residual mass
// and its final sample. The general path runs instead (counted) when the cut may lie outside the
// candidates or a p tie spans two keys at the cut.

constexpr int kListSlots = 8;  // R: per-thread list length
constexpr int kMaxTiles = 16;  // unfiltered: the final sample re-reads 1/16 of the stop node's row or less

struct Cand {
  uint64_t* list = nullptr;  // [R * blockDim]: slot j of thread t at j * blockDim + t; then p of `key`
  uint64_t* key = nullptr;   // [cap] candidates (key << 32 | ~index), sorted descending
  int R = 0;
  int64_t n_live = 0;  // key[0, n_live) hold every positive p of the current node (when `live`)
  bool live = false;
};

__device__ __forceinline__ uint64_t cand_key(uint32_t key, int64_t i) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ uint32_t cand_order(uint64_t c) { return static_cast<uint32_t>(c >> 32); }
__device__ __forceinline__ int64_t cand_index(uint64_t c) { return 0xffffffffu - static_cast<uint32_t>(c); }

// Sorts a[0, n) descending, n a power of two (bitonic network); every thread calls it after a
// barrier that published a; it ends with a barrier.
__device__ void bitonic_sort_desc(uint64_t* a, int64_t n) {
  for (int64_t k = 2; k <= n; k <<= 1) {
    for (int64_t j = k >> 1; j > 0; j >>= 1) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        const int64_t l = i ^ j;
        if (l > i) {
          const uint64_t x = a[i], y = a[l];
          if (((i & k) == 0) == (x < y)) {
            a[i] = y;
            a[l] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ int64_t pow2_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// The one-pass filter of a node (above); false when the general path must decide (block-uniform).
template <typename T>
__device__ __noinline__ bool node_dist_onepass(const T* __restrict__ row, int64_t V, double inv_t, int64_t top_k, double top_p,
                                  Cand& c, Smem& s, Dist& d) {
  const int64_t bd = blockDim.x, t = threadIdx.x;
  const int R = c.R;
  double tm = -inf_d(), tz = 0.0;
  bool any_nan = false, dropped = false;
  int n_in = 0, lpos = 0;
  uint64_t lmin = 0;  // the list's smallest pair, at slot lpos
  block_for_each(row, 0, V, [&](int64_t i, float logit) {
    online_add(mul_rn(static_cast<double>(logit), inv_t), tm, tz, any_nan);
    const uint64_t ck = cand_key(order_key(logit), i);
    if (n_in < R) {
      c.list[n_in * bd + t] = ck;
      if (n_in == 0 || ck < lmin) {
        lmin = ck;
        lpos = n_in;
      }
      ++n_in;
    } else {
      dropped = true;  // ck or the evicted pair: below the final lmin
      if (ck > lmin) {
        c.list[lpos * bd + t] = ck;
        lmin = ck;
        for (int j = 0; j < R; ++j) {
          const uint64_t o = c.list[j * bd + t];
          if (o < lmin) {
            lmin = o;
            lpos = j;
          }
        }
      }
    }
  });
  double m = 0.0, z = 1.0;
  bool nan = false;
  finish_max_sum(tm, tz, any_nan, s, &m, &z, &nan);
  // every element with an order key > tk is in a list (tk = -1: every element is)
  const int64_t tk = block_reduce<IntOp::kMax>(dropped ? static_cast<int64_t>(cand_order(lmin)) : -1, s);
  int mine = 0, n_c = 0;
  for (int j = 0; j < n_in; ++j) mine += static_cast<int64_t>(cand_order(c.list[j * bd + t])) > tk;
  int at = block_prefix_sum(mine, s.cnt, &n_c);
  if (n_c == 0) return false;  // the list minimum ties the row's largest key (a flat row)
  for (int j = 0; j < n_in; ++j) {
    const uint64_t ck = c.list[j * bd + t];
    if (static_cast<int64_t>(cand_order(ck)) > tk) c.key[at++] = ck;
  }
  const int64_t n_pad = pow2_at_least(n_c);
  for (int64_t i = n_c + t; i < n_pad; i += bd) c.key[i] = 0;
  __syncthreads();
  bitonic_sort_desc(c.key, n_pad);

  d.inv_t = inv_t;
  d.topk = top_k > 0 && top_k < V;
  if (d.topk) {
    if (n_c < top_k) return false;
    d.thr_x = mul_rn(static_cast<double>(key_to_float(cand_order(c.key[top_k - 1]))), inv_t);
  }
  d.m = m;
  // as node_dist: top-k removes NaN logits (x >= thr_x fails), so only its threshold can be NaN
  d.nan = (d.topk ? isnan_d(d.thr_x) : nan) || !(m > -inf_d() && m < inf_d());
  if (d.topk && !d.nan) {  // Z over the kept x, every one of them a candidate
    double part = 0.0;
    for (int64_t i = t; i < n_c; i += bd) {
      const double x = mul_rn(static_cast<double>(key_to_float(cand_order(c.key[i]))), inv_t);
      part += x >= d.thr_x ? exp(sub_rn(x, m)) : 0.0;
    }
    z = block_sum(part, s);
  }
  d.z = z;
  const bool covers = d.topk || tk < 0;  // the candidates hold every positive p
  c.n_live = n_c;
  if (top_p < 1.0 && !d.nan) {
    // p in sorted order is non-increasing, unless a NaN (p = 0 under top-k) sorts first
    if (cand_order(c.key[0]) == 0xffffffffu) return false;
    double* cp = reinterpret_cast<double*>(c.list);
    int64_t lo, hi;
    chunk_of(n_c, &lo, &hi);
    double local = 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      cp[i] = base_prob(d, key_to_float(cand_order(c.key[i])));
      local += cp[i];
    }
    double total = 0.0;
    double e = block_exclusive_scan(local, s, &total);
    int64_t first = n_c;  // the first position whose exclusive mass reaches top_p
    for (int64_t i = lo; i < hi && first == n_c; ++i) {
      if (e >= top_p) first = i;
      e = add_rn(e, cp[i]);
    }
    const int64_t j = block_reduce<IntOp::kMin>(first, s);  // >= 1: position 0 has mass 0 < top_p
    if (j == n_c && !covers) return false;  // the cut may lie past the candidates
    const double tau = cp[j - 1];
    // a dropped token (key <= tk) may tie the smallest kept p
    if (!covers && !(tau > base_prob(d, key_to_float(static_cast<uint32_t>(tk))))) return false;
    uint64_t tau_key = 0;  // 0: every positive p kept
    int64_t cut = V;
    if (j < n_c && tau > 0.0) {
      tau_key = prob_key(tau);
      if (cp[j] == tau) {
        // ties across the cut keep the lowest indices: right when the tied run is one order key
        int64_t r0 = V, r1 = -1;
        for (int64_t i = lo; i < hi; ++i) {
          if (cp[i] == tau) {
            r0 = i < r0 ? i : r0;
            r1 = i;
          }
        }
        r0 = block_reduce<IntOp::kMin>(r0, s);
        r1 = block_reduce<IntOp::kMax>(r1, s);
        if (cand_order(c.key[r0]) != cand_order(c.key[r1])) return false;
        cut = cand_index(c.key[j - 1]);
      }
    }
    d.tau = tau_key;
    d.cut = cut;
    double part = 0.0;
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t k = prob_key(cp[i]);
      part += (k > tau_key || (k == tau_key && cand_index(c.key[i]) <= cut)) ? cp[i] : 0.0;
    }
    d.z2 = block_sum(part, s);
    d.filt = true;
    c.n_live = tau_key > 0 ? j : n_c;
  }
  c.live = !d.nan;  // a NaN row: every p is NaN, the row scans handle it
  return true;
}

#ifdef REDRAFTER_EMULATE
int64_t g_general_nodes = 0;  // visited filtered nodes that took the general path (emulator only)
#endif
int g_list_slots = -1;        // verify_sample_set_list_slots: -1 default, 0 never the one-pass filter

// A visited node's Dist: the one-pass filter when a filter is on and the lists fit, else (or when
// it cannot decide) the general path.
template <typename T>
__device__ Dist visit_node(const T* __restrict__ row, int64_t V, double inv_t, int64_t top_k, double top_p, Cand& c,
                           const Tiles& tl, Smem& s) {
  c.live = false;
  if (c.R > 0) {
    Dist d;
    if (node_dist_onepass(row, V, inv_t, top_k, top_p, c, s, d)) return d;
#ifdef REDRAFTER_EMULATE
    if (threadIdx.x == 0) ++g_general_nodes;
#endif
    c.live = false;
  }
  return node_dist(row, V, inv_t, top_k, top_p, s, tl);
}

__device__ __forceinline__ bool rejected(const int64_t* rej, int n_rej, const uint32_t* bits, int64_t v) {
  if (bits) return (bits[v >> 5] >> (v & 31)) & 1u;
  for (int i = 0; i < n_rej; ++i) {
    if (rej[i] == v) return true;
  }
  return false;
}

// The residual mass at the node: sum of p over the tokens not rejected (a full pass).
template <typename T>
__device__ double residual_mass(const T* __restrict__ row, int64_t V, const Dist& d, const int64_t* rej, int n_rej,
                                const uint32_t* bits, Smem& s) {
  double part = 0.0;
  block_for_each(row, 0, V, [&](int64_t v, float x) { part += rejected(rej, n_rej, bits, v) ? 0.0 : prob(d, x, v); });
  return block_sum(part, s);
}

// reference.sample_inverse_cdf over the residual distribution: the first index whose prefix sum
// exceeds u * total (total: the residual mass), clamped to the last positive p (0 when none).
// Tiles of blockDim * E elements in index order, E per thread (one 16-byte word when aligned):
// sequential sums within a thread's E, a block scan across threads, a carry across tiles; stops
// at the tile holding the crossing.
// From element `start` with the mass before it `carry` (0, 0: the whole row); -1 when no p in
// [start, V) is positive and the crossing was not found.
template <typename T>
__device__ __noinline__ int64_t inverse_cdf(const T* __restrict__ row, int64_t V, const Dist& d, const int64_t* rej, int n_rej,
                               const uint32_t* bits, double total, float u, Smem& s, int64_t start = 0,
                               double carry = 0.0) {
  constexpr int E = 16 / static_cast<int>(sizeof(T));
  const bool vec = (reinterpret_cast<uintptr_t>(row + start) & 15u) == 0;
  const double thr = mul_rn(static_cast<double>(u), total);
  int64_t last = -1, first = V;
  for (int64_t t0 = start; t0 < V; t0 += static_cast<int64_t>(blockDim.x) * E) {
    const int64_t i0 = t0 + static_cast<int64_t>(threadIdx.x) * E;
    float x[E];
    if (vec && i0 + E <= V) {
      const uint4 w = ld_global(reinterpret_cast<const uint4*>(row + i0));
#pragma unroll
      for (int j = 0; j < E; ++j) x[j] = vec_elem<T>(w, j);
    } else {
      for (int j = 0; j < E; ++j) x[j] = i0 + j < V ? to_float(ld_global(row + i0 + j)) : 0.0f;
    }
    double p[E], local = 0.0;
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const int64_t v = i0 + j;
      p[j] = v < V && !rejected(rej, n_rej, bits, v) ? prob(d, x[j], v) : 0.0;
      local += p[j];
      if (p[j] > 0.0) last = v;
    }
    double tile = 0.0;
    const double start = block_exclusive_scan(local, s, &tile);
    int64_t found = V;
    double c = 0.0;
    for (int j = 0; j < E; ++j) {
      c += p[j];
      if (p[j] > 0.0 && add_rn(add_rn(carry, start), c) > thr) {
        found = i0 + j;
        break;
      }
    }
    first = block_reduce<IntOp::kMin>(found, s);
    if (first < V) break;  // block-uniform
    carry = add_rn(carry, tile);
  }
  if (first < V) return first;  // a positive p: at most the last positive index
  return block_reduce<IntOp::kMax>(last, s);
}

// inverse_cdf at an unfiltered stop node with tile sums: the tile masses (the pass's per-thread
// sums rescaled to the max, over z, less the rejected p) locate the crossing's tile, and the row
// is scanned from there with their sum as the carry (the whole row when no positive p follows).
template <typename T>
__device__ __noinline__ int32_t inverse_cdf_tiled(const T* __restrict__ row, int64_t V, const Dist& d, const int64_t* rej,
                                     int n_rej, const uint32_t* bits, double total, float u, const Tiles& tl,
                                     Smem& s) {
  const double tmx = tl.tmax[threadIdx.x];
  const double sc = tmx > -inf_d() ? exp(sub_rn(tmx, d.m)) : 0.0;
  for (int j = 0; j < tl.nt; ++j) {
    const double mj = block_sum(tl.part[j * blockDim.x + threadIdx.x] * sc, s);
    if (threadIdx.x == 0) tl.mass[j] = mj / d.z;
  }
  const int64_t vlo = row_head(row, V);
  if (threadIdx.x == 0) {
    for (int r = 0; r < n_rej; ++r) tl.mass[tile_of(tl, rej[r], vlo)] -= prob(d, to_float(ld_global(row + rej[r])), rej[r]);
  }
  __syncthreads();
  const double thr = mul_rn(static_cast<double>(u), total);
  int js = 0;
  double carry = 0.0;
  while (js + 1 < tl.nt && add_rn(carry, tl.mass[js]) <= thr) carry = add_rn(carry, tl.mass[js++]);
  int64_t tok = inverse_cdf(row, V, d, rej, n_rej, bits, total, u, s, js == 0 ? 0 : vlo + (int64_t{js} << tl.sh), carry);
  if (tok < 0 && js > 0) tok = inverse_cdf(row, V, d, rej, n_rej, bits, total, u, s);
  return static_cast<int32_t>(tok < 0 ? 0 : tok);
}

// residual_mass from the kept candidates (c.live: they hold every positive p of the node).
__device__ double residual_mass_live(const Cand& c, const Dist& d, const int64_t* rej, int n_rej, const uint32_t* bits,
                                     Smem& s) {
  double part = 0.0;
  for (int64_t i = threadIdx.x; i < c.n_live; i += blockDim.x) {
    const int64_t v = cand_index(c.key[i]);
    part += rejected(rej, n_rej, bits, v) ? 0.0 : prob(d, key_to_float(cand_order(c.key[i])), v);
  }
  return block_sum(part, s);
}

// inverse_cdf over the kept candidates (c.live), re-sorted by index: the same positive p in the
// same order as the row scan, without reading the row again.
__device__ __noinline__ int32_t inverse_cdf_live(Cand& c, int64_t V, const Dist& d, const int64_t* rej, int n_rej,
                                    const uint32_t* bits, double total, float u, Smem& s) {
  const int64_t n = c.n_live, n_pad = pow2_at_least(n);
  for (int64_t i = threadIdx.x; i < n_pad; i += blockDim.x) {
    const uint64_t k = c.key[i];
    c.key[i] = i < n ? (k << 32) | (k >> 32) : 0;  // (~index << 32 | key): descending is index order
  }
  __syncthreads();
  bitonic_sort_desc(c.key, n_pad);
  auto index_at = [&](int64_t i) { return static_cast<int64_t>(0xffffffffu - static_cast<uint32_t>(c.key[i] >> 32)); };
  auto p_at = [&](int64_t i, int64_t v) {
    return rejected(rej, n_rej, bits, v) ? 0.0 : prob(d, key_to_float(static_cast<uint32_t>(c.key[i])), v);
  };
  const double thr = mul_rn(static_cast<double>(u), total);
  int64_t lo, hi;
  chunk_of(n, &lo, &hi);
  double local = 0.0;
  int64_t last = -1;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t v = index_at(i);
    const double p = p_at(i, v);
    local += p;
    if (p > 0.0) last = v;
  }
  double all = 0.0;
  const double start = block_exclusive_scan(local, s, &all);
  int64_t found = V;
  double run = 0.0;
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t v = index_at(i);
    const double p = p_at(i, v);
    run += p;
    if (p > 0.0 && add_rn(start, run) > thr) {
      found = v;
      break;
    }
  }
  const int64_t first = block_reduce<IntOp::kMin>(found, s);
  if (first < V) return static_cast<int32_t>(first);
  const int64_t lp = block_reduce<IntOp::kMax>(last, s);
  return static_cast<int32_t>(lp < 0 ? 0 : lp);
}

template <typename T, typename I>
__global__ void __launch_bounds__(kThreads) verify_sample_kernel(
    const T* __restrict__ logits, int64_t n_rows, int64_t V, const I* __restrict__ beams,
    const I* __restrict__ beam_node, int64_t W, int64_t L, const float* __restrict__ accept_u,
    const float* __restrict__ sample_u, double inv_t, int64_t top_k, double top_p, bool staged, bool bitmap, int R,
    int64_t cap, int nt, int sh, int32_t* __restrict__ accept_len, int32_t* __restrict__ best_beam, int32_t* __restrict__ path_nodes,
    int32_t* __restrict__ next_token) {
  const int64_t b = blockIdx.x;
  Smem& s = *dynamic_smem<Smem>();
  int64_t* s_nodes = reinterpret_cast<int64_t*>(&s + 1);  // [W*L] when staged
  int64_t* s_toks = s_nodes + (staged ? W * L : 0);        // [W*L] when staged
  int64_t* rej = s_toks + (staged ? W * L : 0);            // [W] rejected tokens of the current node
  Cand cand;  // [cap] lists then [cap] candidates, when the one-pass filter runs (R > 0)
  cand.R = R;
  cand.list = reinterpret_cast<uint64_t*>(rej + W);
  cand.key = cand.list + cap;
  Tiles tl;  // or, unfiltered, [nt * blockDim + blockDim + nt] tile sums in the same place
  tl.nt = nt;
  tl.sh = sh;
  tl.part = reinterpret_cast<double*>(rej + W);
  tl.tmax = tl.part + nt * blockDim.x;
  tl.mass = tl.tmax + blockDim.x;
  uint32_t* bits = bitmap ? reinterpret_cast<uint32_t*>(cand.key + cap + (nt > 0 ? nt * (blockDim.x + 1) + blockDim.x : 0))
                          : nullptr;  // [ceil(V/32)]
  const T* rows = logits + b * n_rows * V;
  const I* beam = beams + b * W * L;
  const I* bn = beam_node + b * W * L;
  if (staged) {
    for (int64_t i = threadIdx.x; i < W * L; i += blockDim.x) {
      s_nodes[i] = static_cast<int64_t>(ld_global(bn + i));
      s_toks[i] = static_cast<int64_t>(ld_global(beam + i));
    }
  }
  if (bitmap) {
    for (int64_t i = threadIdx.x; i < (V + 31) / 32; i += blockDim.x) bits[i] = 0;
  }
  if (threadIdx.x == 0) s.n_rej = 0;
  __syncthreads();
  auto node_at = [&](int64_t i) { return staged ? s_nodes[i] : static_cast<int64_t>(ld_global(bn + i)); };
  auto tok_at = [&](int64_t i) { return staged ? s_toks[i] : static_cast<int64_t>(ld_global(beam + i)); };
  auto valid_node = [&](int64_t n) { return n >= 0 && n < n_rows; };
  int64_t cur = node_at(0);
  int64_t a = 0;
  const bool root_ok = valid_node(cur);  // block-uniform, like every branch below
  int32_t tok = -1;
  if (root_ok) {
    Dist d = visit_node(rows + cur * V, V, inv_t, top_k, top_p, cand, tl, s);
    // sum of the node's p: 1 up to rounding (the reference's sequential sum differs by ~V ulp at
    // most; decisions are compared with a 1e-9 margin); NaN when every p is NaN
    double mass = d.nan ? bits_to_double(0x7ff8000000000000ull) : 1.0;
    for (int64_t dep = 0; dep + 1 < L; ++dep) {
      int64_t child = -1, rank = 0;
      for (int64_t w = 0; w < W && child < 0; ++w) {
        if (node_at(w * L + dep) != cur) continue;
        const int64_t c = node_at(w * L + dep + 1);
        bool seen = false;  // a lower beam already brought this child
        for (int64_t v = 0; v < w && !seen; ++v) seen = node_at(v * L + dep + 1) == c;
        if (seen) continue;
        const int64_t t = tok_at(w * L + dep + 1);
        // a child outside the logits or a token outside [0, V) is rejected without touching p
        const bool ok = valid_node(c) && t >= 0 && t < V;
        const int n_rej = s.n_rej;
        if (threadIdx.x == 0) {  // the drafted token's p and the uniform: one read, broadcast
          s.bval[0] = ok && !rejected(rej, n_rej, bits, t) ? prob(d, to_float(ld_global(rows + cur * V + t)), t) : 0.0;
          s.bval[1] = static_cast<double>(ld_global(accept_u + (b * (L - 1) + dep) * W + rank));
        }
        __syncthreads();
        const double pt = s.bval[0], u = s.bval[1];
        __syncthreads();
        ++rank;
        if (ok && mul_rn(u, mass) < pt) {
          child = c;
        } else if (ok) {
          // p(t) = 0: the remaining mass drops by p(t); when that cancels more than 10 bits, the
          // difference is no longer accurate to ~1e-13 and the mass is summed again
          if (threadIdx.x == 0 && pt > 0.0) {
            rej[n_rej] = t;
            s.n_rej = n_rej + 1;
            if (bits) bits[t >> 5] |= 1u << (t & 31);
          }
          __syncthreads();
          const double left = sub_rn(mass, pt);
          if (left >= mass * (1.0 / 1024)) {
            mass = left;
          } else {
            mass = cand.live ? residual_mass_live(cand, d, rej, s.n_rej, bits, s)
                          : residual_mass(rows + cur * V, V, d, rej, s.n_rej, bits, s);
          }
        }
      }
      if (child < 0) break;  // every child rejected: sample from the residual
      // forget the rejections at the old node
      if (bits) {
        for (int i = threadIdx.x; i < s.n_rej; i += blockDim.x) bits[rej[i] >> 5] = 0;
      }
      __syncthreads();
      if (threadIdx.x == 0) s.n_rej = 0;
      cur = child;
      ++a;
      d = visit_node(rows + cur * V, V, inv_t, top_k, top_p, cand, tl, s);  // starts with a barrier-separated pass
      mass = d.nan ? bits_to_double(0x7ff8000000000000ull) : 1.0;
    }
    const float su = ld_global(sample_u + b);
    if (cand.live) {
      tok = inverse_cdf_live(cand, V, d, rej, s.n_rej, bits, mass, su, s);
    } else if (tl.nt > 0 && !d.nan) {
      tok = inverse_cdf_tiled(rows + cur * V, V, d, rej, s.n_rej, bits, mass, su, tl, s);
    } else {
      const int64_t r = inverse_cdf(rows + cur * V, V, d, rej, s.n_rej, bits, mass, su, s);
      tok = static_cast<int32_t>(r < 0 ? 0 : r);
    }
  }
  if (threadIdx.x != 0) return;  // no barrier follows
  int64_t best = 0;
  while (best < W - 1 && node_at(best * L + a) != cur) ++best;
  st_global(accept_len + b, static_cast<int32_t>(a));
  st_global(best_beam + b, static_cast<int32_t>(best));
  for (int64_t i = 0; i < L; ++i) {
    st_global(path_nodes + b * L + i, i <= a ? static_cast<int32_t>(node_at(best * L + i)) : -1);
  }
  st_global(next_token + b, tok);
}

template <typename T, typename I>
cudaError_t launch(const void* logits, int64_t n_rows, int64_t V, const void* beams, const void* beam_node,
                   int64_t B, int64_t W, int64_t L, const float* accept_u, const float* sample_u, double inv_t,
                   int64_t top_k, double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                   int32_t* next_token, cudaStream_t stream) {
  const int64_t want = (V + 31) / 32 * 32;
  const unsigned threads = static_cast<unsigned>(want < kThreads ? want : kThreads);
  const bool staged = W * L * 16 <= kMaxStagedBytes;
  const bool bitmap = V <= kMaxBitmapV;
  const size_t base = sizeof(Smem) + (staged ? W * L * 16 : 0) + W * 8 + (bitmap ? (V + 31) / 32 * 4 : 0);
  if (base > 160 * 1024) return cudaErrorInvalidValue;
  // the one-pass filter's two candidate arrays, when a filter is on: halved until they fit
  const bool filtered = (top_k > 0 && top_k < V) || top_p < 1.0;
  int R = filtered ? (g_list_slots >= 0 ? g_list_slots : kListSlots) : 0;
  auto cap_of = [&](int r) {
    int64_t p = 1;
    while (p < static_cast<int64_t>(r) * threads) p <<= 1;
    return r > 0 ? p : int64_t{0};
  };
  while (R > 0 && base + static_cast<size_t>(cap_of(R)) * 16 > 160 * 1024) R /= 2;
  const int64_t cap = cap_of(R);
  // unfiltered: the tile sums (tiles of 2^sh >= one scan step elements, at most kMaxTiles of them)
  int nt = 0, sh = 0;
  if (!filtered) {
    while ((int64_t{1} << sh) < static_cast<int64_t>(threads) * (16 / static_cast<int64_t>(sizeof(T))) ||
           (int64_t{kMaxTiles} << sh) < V)
      ++sh;
    nt = static_cast<int>((V + (int64_t{1} << sh) - 1) >> sh);
    if (nt < 2 || base + static_cast<size_t>(nt * (threads + 1) + threads) * 8 > 160 * 1024) nt = 0;
  }
  const size_t smem = base + static_cast<size_t>(cap) * 16 + (nt > 0 ? static_cast<size_t>(nt * (threads + 1) + threads) * 8 : 0);
  return launch_kernel("verify_sample.walk", verify_sample_kernel<T, I>, dim3(static_cast<unsigned>(B)),
                       dim3(threads), smem, stream, static_cast<const T*>(logits), n_rows, V,
                       static_cast<const I*>(beams), static_cast<const I*>(beam_node), W, L, accept_u, sample_u, inv_t,
                       top_k, top_p, staged, bitmap, R, cap, nt, sh, accept_len, best_beam, path_nodes, next_token);
}

template <typename T>
cudaError_t launch_t(IndexType it, const void* logits, int64_t n_rows, int64_t V, const void* beams,
                     const void* beam_node, int64_t B, int64_t W, int64_t L, const float* au, const float* su,
                     double inv_t, int64_t top_k, double top_p, int32_t* a, int32_t* bb, int32_t* pn, int32_t* nt,
                     cudaStream_t s) {
  if (it == IndexType::kInt64)
    return launch<T, int64_t>(logits, n_rows, V, beams, beam_node, B, W, L, au, su, inv_t, top_k, top_p, a, bb, pn,
                              nt, s);
  return launch<T, int32_t>(logits, n_rows, V, beams, beam_node, B, W, L, au, su, inv_t, top_k, top_p, a, bb, pn, nt,
                            s);
}

}  // namespace

void verify_sample_set_list_slots(int slots) { g_list_slots = slots; }

int64_t verify_sample_general_nodes() {
#ifdef REDRAFTER_EMULATE
  const int64_t n = g_general_nodes;
  g_general_nodes = 0;
  return n;
#else
  return -1;
#endif
}

size_t verify_sample_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, int64_t W, FloatType logits_type,
                                     double temperature) {
  if (temperature == 0.0) return verify_greedy_workspace_bytes(B, n_logit_rows, V, W, logits_type);
  return 8;  // unused: the sampling kernel keeps no per-token state in global memory
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
      top_k < 0)
    return cudaErrorInvalidValue;
  const double inv_t = 1.0 / temperature;  // as the reference: one reciprocal, then a multiply per logit
  switch (logits_type) {
    case FloatType::kFloat16:
      return launch_t<Half>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u, inv_t,
                            top_k, top_p, accept_len, best_beam, path_nodes, next_token, stream);
    case FloatType::kBFloat16:
      return launch_t<BFloat16>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u,
                                inv_t, top_k, top_p, accept_len, best_beam, path_nodes, next_token, stream);
    default:
      return launch_t<float>(index_type, logits, n_logit_rows, V, beams, beam_node, B, W, L, accept_u, sample_u, inv_t,
                             top_k, top_p, accept_len, best_beam, path_nodes, next_token, stream);
  }
}

}  // namespace redrafter::cuda
