// beam_topk: log-softmax + running score + top-W over W*V + reorder by parent, in four launches
// and one pass over the logits (no [B, W, V] intermediate):
//  1. split (grid R x P, R = B*W rows, P splits of V, P chosen so that R*P >= 264 CTAs where V
//     allows): one pass over the split with 16-byte loads that keeps the online max and sum of
//     exp(x - max) and stages the elements' order keys in shared memory; then the split's
//     K = W + 8 best logits by (x desc, index asc) from shared memory (radix select on the order
//     key with a parallel digit search, then an ordered ballot compaction: output in index order).
//  2. row (grid R): the row's max M and log-sum-exp from the split statistics, the candidate value
//     f = s + ((x - M) - logsum) exactly as the reference computes it, and the row's top
//     C = min(W, V) by (f desc, index asc). f is monotone in x but rounding can make f equal for
//     different x, and equal f are ordered by index: when a split that dropped elements has its
//     K-th logit's f equal to the C-th selected f, a dropped element could tie it, and the row
//     is selected again exactly over all V (rare: ~8 more passes over that row). Rows whose
//     log-softmax is NaN (a NaN or +inf logit, all -inf) or whose score is -inf take their first
//     C indices, like the stable sort.
//  3. merge (grid B): top-W of the W*C candidates by (f desc, flat index w*V + v asc), sorted,
//     scores, parents and token histories.
//  4. gather (grid B*W x pieces of 4 KB): state rows copied from their parent beams in 16-byte
//     words (4 or 1 when unaligned).
// The block-wide selection (block_select) is exact for any keys: radix select of the k-th largest
// 32-bit key (4 passes of 8 bits, shared-memory histogram), then every key above it and the
// lowest-positioned keys equal to it, in position order. Global bound: one read of the logits
// and the state, one write of the state; the split/row workspace adds R*P*(W+8)*8 bytes each way.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kThreads = 256;  // block_select's digit search needs exactly 256 threads (one per bin)
constexpr int kSlack = 8;
constexpr int kItems = 8;  // positions per thread in block_select's ordered compaction
constexpr int64_t kTargetCtas = 264;  // ~2 waves of CTAs on a 132-SM GPU
constexpr int64_t kMinChunk = 2048;
constexpr int64_t kMaxChunk = 8192;            // split keys staged in shared memory: 32 KB
constexpr int64_t kMaxCandBytes = 128 * 1024;  // row kernel: candidates staged in shared memory
constexpr int64_t kMaxSmem = 160 * 1024;       // below sm_80's 163 KB opt-in limit
constexpr int64_t kGatherUnits = kThreads;     // 16-byte words per gather CTA (4 KB)

struct Plan {
  int64_t R, P, chunk, K, C;
};

__host__ __device__ inline Plan make_plan(int64_t B, int64_t W, int64_t V) {
  Plan p;
  p.R = B * W;
  p.K = W + kSlack;
  p.C = W < V ? W : V;
  int64_t P = (kTargetCtas + p.R - 1) / p.R;
  int64_t chunk = (V + P - 1) / P;
  if (chunk < kMinChunk) chunk = kMinChunk;
  if (chunk > kMaxChunk) chunk = kMaxChunk;
  P = (V + chunk - 1) / chunk;
  const int64_t cap = kMaxCandBytes / (8 * p.K);
  if (P > cap) {  // very wide beams: fewer, longer splits (run() checks the shared memory)
    P = cap < 1 ? 1 : cap;
    chunk = (V + P - 1) / P;
    P = (V + chunk - 1) / chunk;
  }
  p.P = P;
  p.chunk = chunk;
  return p;
}

__host__ __device__ inline int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

// Workspace views (all 16-byte aligned).
struct Work {
  float* sp_m;     // [R, P] split max
  double* sp_s;    // [R, P] split sum of exp(x - max)
  int32_t* sp_nan; // [R, P] split holds a NaN
  float* sp_thr;   // [R, P] the split's K-th logit (lowest kept)
  int32_t* sp_cnt; // [R, P] kept logits
  float* sp_x;     // [R, P, K] kept logits, index order
  int32_t* sp_i;   // [R, P, K] their token ids
  float* row_f;    // [R, W] the row's top-C candidate values, index order
  int32_t* row_i;  // [R, W] their token ids
  size_t bytes;
};

__host__ __device__ inline Work carve(void* base, const Plan& p, int64_t W) {
  Work w;
  char* c = static_cast<char*>(base);
  int64_t off = 0;
  auto take = [&](int64_t bytes) {
    char* at = c ? c + off : nullptr;
    off += align16(bytes);
    return at;
  };
  const int64_t RP = p.R * p.P;
  w.sp_m = reinterpret_cast<float*>(take(RP * 4));
  w.sp_s = reinterpret_cast<double*>(take(RP * 8));
  w.sp_nan = reinterpret_cast<int32_t*>(take(RP * 4));
  w.sp_thr = reinterpret_cast<float*>(take(RP * 4));
  w.sp_cnt = reinterpret_cast<int32_t*>(take(RP * 4));
  w.sp_x = reinterpret_cast<float*>(take(RP * p.K * 4));
  w.sp_i = reinterpret_cast<int32_t*>(take(RP * p.K * 4));
  w.row_f = reinterpret_cast<float*>(take(p.R * W * 4));
  w.row_i = reinterpret_cast<int32_t*>(take(p.R * W * 4));
  w.bytes = static_cast<size_t>(off);
  return w;
}

__device__ __forceinline__ float key_to_float(uint32_t k) {
  return bits_to_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ float neg_inf() { return bits_to_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return bits_to_float(0x7f800000u); }
__device__ __forceinline__ float quiet_nan() { return bits_to_float(0x7fc00000u); }

// The reference's candidate value, operation for operation.
__device__ __forceinline__ float candidate(float s, float x, float m, float logsum) { return s + ((x - m) - logsum); }

// Shared memory of block_select: 256 histogram bins + 34 ints.
constexpr int kSelectInts = 256 + 34;

// Positions of the k largest keys among positions [0, n) (ties: lower position first), written to
// out[0, k) in increasing position order; returns the k-th largest key. 1 <= k <= n. Every thread
// of the block calls it; `sm` holds kSelectInts ints of shared memory.
template <typename KeyFn>
__device__ uint32_t block_select(const KeyFn& key, int64_t n, int k, int* sm, int32_t* out) {
  unsigned* hist = reinterpret_cast<unsigned*>(sm);
  int* scratch = sm + 256;  // [0, 32): block_prefix_count, [32, 34): digit, still needed
  uint32_t prefix = 0, pmask = 0;
  int need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[threadIdx.x] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t u = key(i);
      if ((u & pmask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1u);
    }
    __syncthreads();
    // thread t owns digit 255 - t: keys with a larger digit come first; the digit holding the
    // need-th key is the one whose exclusive count is < need <= inclusive count
    const int d = 255 - static_cast<int>(threadIdx.x), c = static_cast<int>(hist[d]);
    int total = 0;
    const int above = block_prefix_sum(c, scratch, &total);
    if (above < need && need <= above + c) {
      scratch[32] = d;
      scratch[33] = need - above;
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(scratch[32]) << shift;
    pmask |= 255u << shift;
    need = scratch[33];
  }
  // ordered compaction, kItems consecutive positions per thread and tile
  const uint32_t thr = prefix;
  int taken = 0, eq_seen = 0;
  const int64_t tile = static_cast<int64_t>(blockDim.x) * kItems;
  for (int64_t t0 = 0; t0 < n && taken < k; t0 += tile) {
    const int64_t first = t0 + static_cast<int64_t>(threadIdx.x) * kItems;
    int eq = 0;
    for (int j = 0; j < kItems; ++j) eq += first + j < n && key(first + j) == thr;
    int eq_total = 0, sel_total = 0;
    const int eq_before = eq_seen + block_prefix_sum(eq, scratch, &eq_total);
    int sel = 0;
    for (int j = 0, e = eq_before; j < kItems && first + j < n; ++j) {
      const uint32_t u = key(first + j);
      sel += u > thr || (u == thr && e++ < need);
    }
    int pos = taken + block_prefix_sum(sel, scratch, &sel_total);
    for (int j = 0, e = eq_before; j < kItems && first + j < n; ++j) {
      const uint32_t u = key(first + j);
      if (u > thr || (u == thr && e++ < need)) out[pos++] = static_cast<int32_t>(first + j);
    }
    eq_seen += eq_total;
    taken += sel_total;
  }
  __syncthreads();
  return thr;
}

// ---- 1. split -------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) split_kernel(const T* __restrict__ logits, int64_t V, Plan p, Work wk) {
  const int64_t r = blockIdx.x, s = blockIdx.y;
  const int64_t lo = s * p.chunk, n = (lo + p.chunk < V ? lo + p.chunk : V) - lo;
  int* sm = dynamic_smem<int>();
  double* red = reinterpret_cast<double*>(sm + kSelectInts + 2);  // [32] (8-byte aligned)
  int32_t* sel = reinterpret_cast<int32_t*>(red + 32);            // [K]
  uint32_t* keys = reinterpret_cast<uint32_t*>(sel + p.K);        // [chunk] order keys

  // one pass: order keys into shared memory, online max and sum of exp(x - max) per thread
  float m = neg_inf();
  double sum = 0.0;
  bool nan = false;
  block_for_each(logits + r * V, lo, lo + n, [&](int64_t i, float x) {
    keys[i - lo] = order_key(x);
    if (is_nan(x)) {
      nan = true;
    } else if (x > m) {
      sum = (m == neg_inf() ? 0.0 : sum * exp(static_cast<double>(m) - static_cast<double>(x))) + 1.0;
      m = x;
    } else if (x > neg_inf()) {
      sum += static_cast<double>(expf(x - m));
    }
  });
  // block max, then the block sum rescaled to it (in double)
  float bm = m;
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(kFullMask, bm, off);
    bm = o > bm ? o : bm;
  }
  if (lane_id() == 0) red[threadIdx.x >> 5] = bm;
  __syncthreads();
  bm = neg_inf();
  for (unsigned w = 0; w < (blockDim.x >> 5); ++w) bm = red[w] > bm ? static_cast<float>(red[w]) : bm;
  __syncthreads();
  double part = m > neg_inf() ? sum * exp(static_cast<double>(m) - static_cast<double>(bm)) : 0.0;
  for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
  if (lane_id() == 0) red[threadIdx.x >> 5] = part;
  const bool any_nan = __syncthreads_or(nan);  // also publishes the keys
  const int64_t at = r * p.P + s;
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (unsigned w = 0; w < (blockDim.x >> 5); ++w) total += red[w];
    st_global(wk.sp_m + at, bm);
    st_global(wk.sp_s + at, total);
    st_global(wk.sp_nan + at, static_cast<int32_t>(any_nan));
  }

  // the split's k best logits by (x desc, index asc), in index order, from shared memory
  const int k = static_cast<int>(p.K < n ? p.K : n);
  const uint32_t thr = block_select([&](int64_t i) { return keys[i]; }, n, k, sm, sel);
  for (int j = threadIdx.x; j < k; j += blockDim.x) {
    st_global(wk.sp_x + at * p.K + j, key_to_float(keys[sel[j]]));
    st_global(wk.sp_i + at * p.K + j, static_cast<int32_t>(lo + sel[j]));
  }
  if (threadIdx.x == 0) {
    st_global(wk.sp_cnt + at, static_cast<int32_t>(k));
    st_global(wk.sp_thr + at, key_to_float(thr));
  }
}

// ---- 2. row ---------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads) row_kernel(const T* __restrict__ logits, const float* __restrict__ scores, int64_t V, int64_t W,
                           Plan p, Work wk) {
  const int64_t r = blockIdx.x;
  const int C = static_cast<int>(p.C);
  int* sm = dynamic_smem<int>();
  float* stat = reinterpret_cast<float*>(sm + kSelectInts);  // [0] max, [1] logsum, [2] mode (as int), [3] n
  int32_t* off = sm + kSelectInts + 4;                        // [P + 1]
  int32_t* sel = off + p.P + 1;                               // [C]
  float* cf = reinterpret_cast<float*>(sel + C);              // [P * K]
  int32_t* ci = reinterpret_cast<int32_t*>(cf + p.P * p.K);   // [P * K]
  const float s = ld_global(scores + r);
  const int64_t base = r * p.P;
  enum { kNormal = 0, kAllNan = 1, kAllNegInf = 2, kExact = 3 };
  if (threadIdx.x == 0) {
    float M = neg_inf();
    bool nan = false;
    for (int64_t q = 0; q < p.P; ++q) {
      const float mq = ld_global(wk.sp_m + base + q);
      M = mq > M ? mq : M;
      nan |= ld_global(wk.sp_nan + base + q) != 0;
    }
    double total = 0.0;
    int32_t n = 0;
    for (int64_t q = 0; q < p.P; ++q) {
      const float mq = ld_global(wk.sp_m + base + q);
      if (mq > neg_inf()) total += ld_global(wk.sp_s + base + q) * exp(static_cast<double>(mq) - M);
      off[q] = n;
      n += ld_global(wk.sp_cnt + base + q);
    }
    off[p.P] = n;
    const float logsum = static_cast<float>(log(total));
    int mode = kNormal;
    if (nan || !(M > neg_inf() && M < pos_inf()) || is_nan(logsum) || is_nan(s)) {
      mode = kAllNan;  // log_softmax is NaN on the whole row
    } else if (s == neg_inf()) {
      mode = kAllNegInf;
    } else if (s == pos_inf()) {
      mode = kExact;  // inf + -inf = NaN for -inf logits: not monotone in x
    }
    stat[0] = M;
    stat[1] = logsum;
    sm[kSelectInts + 2] = mode;
    sm[kSelectInts + 3] = n;
  }
  __syncthreads();
  const float M = stat[0], logsum = stat[1];
  int mode = sm[kSelectInts + 2];
  const int n = sm[kSelectInts + 3];
  if (mode == kAllNan || mode == kAllNegInf) {
    for (int j = threadIdx.x; j < C; j += blockDim.x) {
      st_global(wk.row_f + r * W + j, mode == kAllNan ? quiet_nan() : neg_inf());
      st_global(wk.row_i + r * W + j, static_cast<int32_t>(j));
    }
    return;  // uniform: no barrier follows for anyone
  }
  if (mode == kNormal) {
    for (int64_t e = threadIdx.x; e < p.P * p.K; e += blockDim.x) {
      const int64_t q = e / p.K, j = e % p.K;
      if (j < off[q + 1] - off[q]) {
        cf[off[q] + j] = candidate(s, ld_global(wk.sp_x + (base + q) * p.K + j), M, logsum);
        ci[off[q] + j] = ld_global(wk.sp_i + (base + q) * p.K + j);
      }
    }
    __syncthreads();
    const uint32_t thr = block_select([&](int64_t i) { return order_key(cf[i]); }, n, C, sm, sel);
    // a split that dropped elements and whose lowest kept f equals the threshold: dropped
    // elements may tie the threshold with a lower index
    bool tie = false;
    for (int64_t q = threadIdx.x; q < p.P; q += blockDim.x) {
      const int64_t len = (q + 1) * p.chunk < V ? p.chunk : V - q * p.chunk;
      if (off[q + 1] - off[q] < len && order_key(candidate(s, ld_global(wk.sp_thr + base + q), M, logsum)) >= thr)
        tie = true;
    }
    if (!__syncthreads_or(tie)) {
      for (int j = threadIdx.x; j < C; j += blockDim.x) {
        st_global(wk.row_f + r * W + j, cf[sel[j]]);
        st_global(wk.row_i + r * W + j, ci[sel[j]]);
      }
      return;
    }
    mode = kExact;
  }
  // exact selection over the whole row (rare)
  const T* row = logits + r * V;
  block_select([&](int64_t i) { return order_key(candidate(s, to_float(ld_global(row + i)), M, logsum)); }, V, C,
               sm, sel);
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    st_global(wk.row_f + r * W + j, candidate(s, to_float(ld_global(row + sel[j])), M, logsum));
    st_global(wk.row_i + r * W + j, sel[j]);
  }
}

// ---- 3. merge, 4. gather ----------------------------------------------------------------------

template <typename I>
__global__ void __launch_bounds__(kThreads)
    merge_kernel(const I* __restrict__ tokens, int64_t W, int64_t L, int64_t step, Plan p, Work wk, bool staged,
                 float* __restrict__ scores_out, int32_t* __restrict__ tokens_out, int32_t* __restrict__ parent_out) {
  const int64_t b = blockIdx.x;
  const int64_t C = p.C, n = W * C;
  int* sm = dynamic_smem<int>();
  int32_t* sel = sm + kSelectInts;  // [W] selected positions w*C + j, increasing
  int32_t* order = sel + W;         // [W] the same, sorted by (f desc, flat index asc)
  uint32_t* keys = reinterpret_cast<uint32_t*>(order + W);  // [W*C] when staged
  const float* f = wk.row_f + b * W * W;
  const int32_t* idx = wk.row_i + b * W * W;
  // position w*C + j -> the row's j-th candidate; positions increase with the flat index
  if (staged) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) keys[i] = order_key(ld_global(f + (i / C) * W + i % C));
    __syncthreads();
  }
  auto key = [&](int64_t i) { return staged ? keys[i] : order_key(ld_global(f + (i / C) * W + i % C)); };
  block_select(key, n, static_cast<int>(W), sm, sel);
  for (int64_t j = threadIdx.x; j < W; j += blockDim.x) {
    const uint32_t kj = key(sel[j]);
    int64_t rank = 0;
    for (int64_t i = 0; i < W; ++i) {
      const uint32_t ki = key(sel[i]);
      rank += ki > kj || (ki == kj && sel[i] < sel[j]);
    }
    order[rank] = sel[j];
  }
  __syncthreads();
  for (int64_t j = threadIdx.x; j < W; j += blockDim.x) {
    const int64_t pos = order[j], w = pos / C, c = pos % C;
    st_global(scores_out + b * W + j, ld_global(f + w * W + c));
    st_global(parent_out + b * W + j, static_cast<int32_t>(w));
  }
  for (int64_t e = threadIdx.x; e < W * L; e += blockDim.x) {
    const int64_t j = e / L, t = e % L, pos = order[j], w = pos / C;
    st_global(tokens_out + (b * W + j) * L + t, t == step ? ld_global(idx + w * W + pos % C)
                                                          : static_cast<int32_t>(ld_global(tokens + (b * W + w) * L + t)));
  }
}

// state_out[row] = state[b * W + parent[row]] in words of U (16, 4 or 1 bytes), kGatherUnits words
// per CTA: grid (B*W) x pieces.
template <typename U>
__global__ void __launch_bounds__(kThreads)
    gather_kernel(const U* __restrict__ state, int64_t units, int64_t W, int64_t pieces,
                  const int32_t* __restrict__ parent, U* __restrict__ state_out) {
  const int64_t row = blockIdx.x / pieces, piece = blockIdx.x % pieces;
  const int64_t src = (row / W) * W + ld_global(parent + row);  // parent in [0, W): merge wrote it
  const int64_t lo = piece * kGatherUnits, hi = lo + kGatherUnits < units ? lo + kGatherUnits : units;
  const U* in = state + src * units;
  U* out = state_out + row * units;
  for (int64_t k = lo + threadIdx.x; k < hi; k += blockDim.x) st_global(out + k, ld_global(in + k));
}

template <typename U>
cudaError_t gather(const void* state, int64_t row_bytes, int64_t B, int64_t W, const int32_t* parent,
                   void* state_out, cudaStream_t stream) {
  const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U)), pieces = (units + kGatherUnits - 1) / kGatherUnits;
  return launch_kernel("beam_topk.gather", gather_kernel<U>, dim3(static_cast<unsigned>(B * W * pieces)),
                       dim3(kThreads), 0, stream, static_cast<const U*>(state), units, W, pieces, parent,
                       static_cast<U*>(state_out));
}

template <typename T, typename I>
cudaError_t run(const void* logits, const float* scores, const void* tokens, const void* state,
                int64_t state_row_bytes, int64_t B, int64_t W, int64_t V, int64_t L, int64_t step, float* scores_out,
                int32_t* tokens_out, void* state_out, int32_t* parent_out, void* workspace, cudaStream_t stream) {
  const Plan p = make_plan(B, W, V);
  const Work wk = carve(workspace, p, W);
  const T* x = static_cast<const T*>(logits);
  const size_t select_bytes = kSelectInts * 4 + 16;
  const size_t split_bytes = select_bytes + 32 * 8 + p.K * 4 + p.chunk * 4;
  const size_t row_bytes = select_bytes + (p.P + 1 + p.C) * 4 + 2 * p.P * p.K * 4 + 16;
  if (split_bytes > kMaxSmem || row_bytes > kMaxSmem) return cudaErrorInvalidValue;  // W ~ V / 16 and beyond
  cudaError_t e = launch_kernel("beam_topk.split", split_kernel<T>,
                                dim3(static_cast<unsigned>(p.R), static_cast<unsigned>(p.P)), dim3(kThreads),
                                split_bytes, stream, x, V, p, wk);
  if (e != cudaSuccess) return e;
  e = launch_kernel("beam_topk.row", row_kernel<T>, dim3(static_cast<unsigned>(p.R)), dim3(kThreads), row_bytes,
                    stream, x, scores, V, W, p, wk);
  if (e != cudaSuccess) return e;
  const size_t merge_base = select_bytes + 2 * W * 4, merge_staged = merge_base + W * p.C * 4;
  const bool staged = merge_staged <= static_cast<size_t>(kMaxSmem);
  e = launch_kernel("beam_topk.merge", merge_kernel<I>, dim3(static_cast<unsigned>(B)), dim3(kThreads),
                    staged ? merge_staged : merge_base, stream, static_cast<const I*>(tokens), W, L, step, p, wk,
                    staged, scores_out, tokens_out, parent_out);
  if (e != cudaSuccess || state_row_bytes == 0) return e;
  const uintptr_t both = reinterpret_cast<uintptr_t>(state) | reinterpret_cast<uintptr_t>(state_out);
  if (state_row_bytes % 16 == 0 && both % 16 == 0) {
    return gather<uint4>(state, state_row_bytes, B, W, parent_out, state_out, stream);
  }
  if (state_row_bytes % 4 == 0 && both % 4 == 0) {
    return gather<uint32_t>(state, state_row_bytes, B, W, parent_out, state_out, stream);
  }
  return gather<unsigned char>(state, state_row_bytes, B, W, parent_out, state_out, stream);
}

template <typename T>
cudaError_t run_t(IndexType it, const void* logits, const float* scores, const void* tokens, const void* state,
                  int64_t rb, int64_t B, int64_t W, int64_t V, int64_t L, int64_t step, float* so, int32_t* to,
                  void* st, int32_t* po, void* ws, cudaStream_t stream) {
  if (it == IndexType::kInt64) {
    return run<T, int64_t>(logits, scores, tokens, state, rb, B, W, V, L, step, so, to, st, po, ws, stream);
  }
  return run<T, int32_t>(logits, scores, tokens, state, rb, B, W, V, L, step, so, to, st, po, ws, stream);
}

}  // namespace

size_t beam_topk_workspace_bytes(int64_t B, int64_t W, int64_t V) {
  return carve(nullptr, make_plan(B, W, V), W).bytes;
}

cudaError_t beam_topk(const void* logits, FloatType logits_type, const float* scores, const void* tokens,
                      IndexType tokens_type, const void* state, int64_t state_row_bytes, int64_t B, int64_t W,
                      int64_t V, int64_t L, int64_t step, float* scores_out, int32_t* tokens_out, void* state_out,
                      int32_t* parent_out, void* workspace, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (W < 1 || V < 1 || V > 0x7fffffff || step < 1 || step >= L || B * W > 0x7fffffff) return cudaErrorInvalidValue;
  switch (logits_type) {
    case FloatType::kFloat16:
      return run_t<Half>(tokens_type, logits, scores, tokens, state, state_row_bytes, B, W, V, L, step, scores_out,
                         tokens_out, state_out, parent_out, workspace, stream);
    case FloatType::kBFloat16:
      return run_t<BFloat16>(tokens_type, logits, scores, tokens, state, state_row_bytes, B, W, V, L, step,
                             scores_out, tokens_out, state_out, parent_out, workspace, stream);
    default:
      return run_t<float>(tokens_type, logits, scores, tokens, state, state_row_bytes, B, W, V, L, step, scores_out,
                          tokens_out, state_out, parent_out, workspace, stream);
  }
}

}  // namespace redrafter::cuda
