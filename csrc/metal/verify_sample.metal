// verify_sample: exact sampling by recursive rejection over the trie (reference.verify_sample), in
// float32 (MSL has no double).
//
// Kernel verify_sample_<dtype> (dtype float32 / float16 / bfloat16; one threadgroup per batch row):
//   buffer(0) logits [B, n_logit_rows, V] (dtype)   buffer(1) beams [B, W, L] int32
//   buffer(2) beam_node [B, W, L] int32       buffer(3) accept_u [B, L-1, W] float32
//   buffer(4) sample_u [B] float32
//   buffer(5) accept_len [B] int32 (out)      buffer(6) best_beam [B] int32 (out)
//   buffer(7) path_nodes [B, L] int32 (out)   buffer(8) next_token [B] int32 (out)
//   buffer(9) probs [B, V] float32 (workspace: the current node's remaining distribution)
//   buffer(10) VerifyParams {n_logit_rows, V, W, L, inv_temperature, top_k, top_p}
// Grid: B threadgroups; threadgroup: min(1024, max(32, V / 8 rounded up to 32)) threads (any
// multiple of 32 up to 1024 is correct). temperature == 0 is verify_greedy: the host dispatches
// verify_greedy_<dtype> instead.
//
// Per visited node (at most L per row) the group computes p = sampling_probs(logits[node]):
// x = float(logit) * inv_temperature; top-k keeps x >= the k-th largest x (exact radix select on
// the order key, ties all kept); p = exp(x - max) / sum; top-p keeps the smallest prefix of p
// sorted (desc, index asc) whose mass reaches top_p: the threshold key is found by bisection on
// the 32-bit pattern of p (the mass above a key is a group sum), ties at it are kept in index
// order while the running mass stays below top_p, then p is renormalised. Children are tried in
// beam order: accept iff u * mass < p[t] (mass = group sum of the remaining p), else p[t] = 0.
// The next token is the inverse CDF of the remaining p at sample_u (count of inclusive prefix
// sums <= u * total, clamped to the last positive p).
//
// Numerics: the reference computes in float64 with sequential sums; here every sum is a float32
// group reduction. The integer outputs equal the reference's unless a uniform lands within the
// float32 rounding of a decision threshold (~1e-6 of the mass); tests compare on uniforms whose
// decisions do not change when moved by 3e-6. NaN logits propagate as in the reference (tested:
// a NaN or an all -inf row rejects every child and draws token 0). A node id outside [0, n_logit_rows)
// stops the walk there with next_token -1; a draft token outside [0, V) is rejected.
#include "common.h"

// Largest-k radix select: the k-th largest 32-bit key among keys[0..V) (computed by key_of).
template <typename T>
inline uint kth_largest_x_key(device const T* row, long V, float inv_t, int k, threadgroup atomic_uint* hist,
                              threadgroup uint* digit, uint tid, uint nthreads) {
  uint prefix = 0, pmask = 0;
  int need = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (uint i = tid; i < 256; i += nthreads) atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (long i = tid; i < V; i += nthreads) {
      const uint u = order_key(to_float(row[i]) * inv_t);
      if ((u & pmask) == prefix) atomic_fetch_add_explicit(&hist[(u >> uint(shift)) & 255u], 1u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
      int cum = 0, d = 255;
      for (; d > 0; --d) {
        const int h = int(atomic_load_explicit(&hist[d], memory_order_relaxed));
        if (cum + h >= need) break;
        cum += h;
      }
      digit[0] = uint(d);
      digit[1] = uint(need - cum);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    prefix |= digit[0] << uint(shift);
    pmask |= 255u << uint(shift);
    need = int(digit[1]);
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  return prefix;
}

// Sum of the p whose bit pattern is above `key` (p >= 0: bit patterns order like the values).
inline float mass_above(device const float* q, long V, uint key, threadgroup float* sf, uint tid, uint nthreads) {
  float s = 0.0f;
  for (long i = tid; i < V; i += nthreads) s += as_type<uint>(q[i]) > key ? q[i] : 0.0f;
  return group_sum(s, sf, tid, nthreads);
}

// q[0..V) = the sampling distribution of one logits row (see the header).
template <typename T>
inline void node_probs(device const T* row, device float* q, constant VerifyParams& p, threadgroup float* sf,
                       threadgroup int* si, threadgroup uint* su,
                       threadgroup atomic_uint* hist, threadgroup uint* digit, uint tid, uint nthreads) {
  const long V = p.V;
  const float inv_t = p.inv_temperature;
  // top-k keeps x >= the k-th largest (a NaN x is dropped, as by torch.where); off: all kept, NaN
  // included (a NaN max then makes p NaN everywhere, as in the reference)
  const bool top_k_on = p.top_k > 0 && p.top_k < V;
  float thr = neg_inf();
  if (top_k_on) {
    thr = key_to_float(kth_largest_x_key(row, V, inv_t, p.top_k, hist, digit, tid, nthreads));
  }
  uint kmax = 0;
  for (long i = tid; i < V; i += nthreads) {
    const float x = to_float(row[i]) * inv_t;
    if (!top_k_on || x >= thr) kmax = max(kmax, order_key(x));
  }
  const float m = key_to_float(group_max_uint(kmax, su, tid, nthreads));
  float z = 0.0f;
  for (long i = tid; i < V; i += nthreads) {
    const float x = to_float(row[i]) * inv_t;
    const float e = !top_k_on || x >= thr ? precise::exp(x - m) : 0.0f;
    q[i] = e;
    z += e;
  }
  z = group_sum(z, sf, tid, nthreads);
  for (long i = tid; i < V; i += nthreads) q[i] = q[i] / z;  // the same thread wrote q[i]
  threadgroup_barrier(mem_flags::mem_device);
  if (!(p.top_p < 1.0f)) return;

  // smallest key tau with mass_above(tau) < top_p: the key of the last kept (sorted) element
  uint lo = 0, hi = 0x7f800000u;
  if (mass_above(q, V, 0u, sf, tid, nthreads) < p.top_p) {
    hi = 0;
  } else {
    while (hi - lo > 1u) {  // mass_above(lo) >= top_p > mass_above(hi)
      const uint mid = lo + (hi - lo) / 2u;
      if (mass_above(q, V, mid, sf, tid, nthreads) < p.top_p) {
        hi = mid;
      } else {
        lo = mid;
      }
    }
  }
  const uint tau = hi;
  const float above = mass_above(q, V, tau, sf, tid, nthreads);
  const float p_tau = as_type<float>(tau);
  int ties = 0;
  for (long i = tid; i < V; i += nthreads) ties += as_type<uint>(q[i]) == tau;
  ties = group_sum_int(ties, si, tid, nthreads);
  // ties are kept in index order while the exclusive running mass is below top_p
  int keep = 0;
  float run = above;
  while (keep < ties && run < p.top_p) {
    run += p_tau;
    ++keep;
  }
  // drop what is below tau and the ties past `keep` (their rank in index order: a tiled scan)
  int seen = 0;
  const long tile = long(nthreads) * kScanItems;
  for (long t0 = 0; t0 < V; t0 += tile) {
    const long first = t0 + long(tid) * kScanItems;
    int mine = 0;
    for (int j = 0; j < kScanItems && first + j < V; ++j) mine += as_type<uint>(q[first + j]) == tau;
    int total = 0;
    int rank = seen + group_prefix_sum(mine, si, tid, nthreads, total);
    for (int j = 0; j < kScanItems && first + j < V; ++j) {
      const uint k = as_type<uint>(q[first + j]);
      if (k < tau || (k == tau && rank++ >= keep)) q[first + j] = 0.0f;
    }
    seen += total;
  }
  threadgroup_barrier(mem_flags::mem_device);
  float z2 = 0.0f;
  for (long i = tid; i < V; i += nthreads) z2 += q[i];
  z2 = group_sum(z2, sf, tid, nthreads);
  for (long i = tid; i < V; i += nthreads) q[i] = q[i] / z2;
  threadgroup_barrier(mem_flags::mem_device);
}

// reference.sample_inverse_cdf of q at u.
inline int inverse_cdf(device const float* q, long V, float u, threadgroup float* sf, threadgroup int* si,
                       threadgroup uint* su, uint tid, uint nthreads) {
  float total = 0.0f;
  uint last_pos = 0;
  for (long i = tid; i < V; i += nthreads) {
    total += q[i];
    if (q[i] > 0.0f) last_pos = max(last_pos, uint(i));
  }
  total = group_sum(total, sf, tid, nthreads);
  last_pos = group_max_uint(last_pos, su, tid, nthreads);
  const float thr = u * total;
  float carry = 0.0f;
  int count = 0;
  const long tile = long(nthreads) * kScanItems;
  for (long t0 = 0; t0 < V; t0 += tile) {
    const long first = t0 + long(tid) * kScanItems;
    float mine = 0.0f;
    for (int j = 0; j < kScanItems && first + j < V; ++j) mine += q[first + j];
    float tile_total = 0.0f;
    float c = carry + group_prefix_sum_float(mine, sf, tid, nthreads, tile_total);
    for (int j = 0; j < kScanItems && first + j < V; ++j) {
      c += q[first + j];
      count += c <= thr;
    }
    carry += tile_total;
  }
  count = group_sum_int(count, si, tid, nthreads);
  return min(count, int(last_pos));
}

template <typename T>
[[kernel]] void verify_sample(device const T* logits [[buffer(0)]],
                              device const int* beams [[buffer(1)]],
                              device const int* beam_node [[buffer(2)]],
                              device const float* accept_u [[buffer(3)]],
                              device const float* sample_u [[buffer(4)]],
                              device int* accept_len [[buffer(5)]],
                              device int* best_beam [[buffer(6)]],
                              device int* path_nodes [[buffer(7)]],
                              device int* next_token [[buffer(8)]],
                              device float* probs [[buffer(9)]],
                              constant VerifyParams& p [[buffer(10)]],
                              uint b [[threadgroup_position_in_grid]],
                              uint tid [[thread_position_in_threadgroup]],
                              uint nthreads [[threads_per_threadgroup]]) {
  threadgroup float fscratch[32];
  threadgroup int iscratch[32];
  threadgroup uint uscratch[32];
  threadgroup atomic_uint hist[256];
  threadgroup uint digit[2];
  const long W = p.W, L = p.L, V = p.V, n_logit_rows = p.n_logit_rows;
  device const int* tok = beams + long(b) * W * L;
  device const int* bn = beam_node + long(b) * W * L;
  device float* q = probs + long(b) * V;
  device const T* rows = logits + long(b) * n_logit_rows * V;

  long cur = bn[0];
  long a = 0;
  bool valid = cur >= 0 && cur < n_logit_rows;  // uniform: every thread reads the same values
  if (valid) node_probs(rows + cur * V, q, p, fscratch, iscratch, uscratch, hist, digit, tid, nthreads);
  for (long d = 0; valid && d + 1 < L; ++d) {
    long child = -1;
    int rank = 0;
    for (long w = 0; w < W && child < 0; ++w) {
      if (bn[w * L + d] != cur) continue;
      const int c = bn[w * L + d + 1];
      bool seen = false;  // a lower beam already brought this child
      for (long v = 0; v < w && !seen; ++v) seen = bn[v * L + d + 1] == c;
      if (seen) continue;
      const long t = tok[w * L + d + 1];
      // read before the barriers of the sum: thread 0 may zero q[t] right after them
      const float pt = t >= 0 && t < V ? q[t] : 0.0f;
      float mass = 0.0f;
      for (long i = tid; i < V; i += nthreads) mass += q[i];
      mass = group_sum(mass, fscratch, tid, nthreads);
      const float u = accept_u[(long(b) * (L - 1) + d) * W + rank];
      ++rank;
      if (u * mass < pt) {
        child = c;
      } else {
        if (tid == 0 && t >= 0 && t < V) q[t] = 0.0f;
        threadgroup_barrier(mem_flags::mem_device);
      }
    }
    if (child < 0) break;  // every child rejected: sample from the residual
    cur = child;
    ++a;
    valid = cur >= 0 && cur < n_logit_rows;
    if (valid) node_probs(rows + cur * V, q, p, fscratch, iscratch, uscratch, hist, digit, tid, nthreads);
  }
  const int next = valid ? inverse_cdf(q, V, sample_u[b], fscratch, iscratch, uscratch, tid, nthreads) : -1;
  long best = 0;
  while (best < W - 1 && bn[best * L + a] != cur) ++best;
  for (long i = tid; i < L; i += nthreads) path_nodes[long(b) * L + i] = i <= a ? bn[best * L + i] : -1;
  if (tid == 0) {
    accept_len[b] = int(a);
    best_beam[b] = int(best);
    next_token[b] = next;
  }
}

instantiate_kernel("verify_sample_float32", verify_sample, float)
instantiate_kernel("verify_sample_float16", verify_sample, half)
instantiate_kernel("verify_sample_bfloat16", verify_sample, bf16)
