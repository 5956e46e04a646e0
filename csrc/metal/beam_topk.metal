// beam_topk: one beam-search step. Candidates f = score[b, w] + ((x - max) - logsum) of every
// (w, v), exactly the reference's float32 expression; top-W over the W*V candidates sorted by
// (f desc, flat index w*V + v asc), NaN first like torch.sort(descending=True, stable=True);
// token history and state rows gathered from the parent beams.
//
// Kernels (two dispatches, no [B, W, V] intermediate):
//   beam_topk_rows_<dtype> (dtype float32 / float16 / bfloat16): one threadgroup per beam row r = b*W + w
//     buffer(0) logits [B*W, V] (dtype)   buffer(1) scores [B*W] float32
//     buffer(2) row_f [B*W, W] float32 (out, workspace)   buffer(3) row_i [B*W, W] int32 (out, workspace)
//     buffer(4) BeamTopkParams {W, V, L, step, C, state_units}
//     Grid: B*W threadgroups; threadgroup: min(256, max(32, V / 8 rounded up to 32)) threads (any
//     multiple of 32 up to 1024 is correct).
//     max (the order key's maximum, NaN-propagating like amax), log-sum-exp with a compensated
//     float sum (no double in MSL), then the row's top-C (C = min(W, V)) candidates by
//     (f desc, index asc): exact radix select on the 32-bit order key of f (4 passes of 8 bits,
//     threadgroup histogram), then an ordered compaction; written in index order.
//   beam_topk_merge: one threadgroup per batch row b
//     buffer(0) row_f   buffer(1) row_i   buffer(2) tokens [B, W, L] int32
//     buffer(3) state [B, W, state_units] 16-bit units (any float dtype, copied as bits)
//     buffer(4) scores_out [B, W] float32 (out)   buffer(5) tokens_out [B, W, L] int32 (out)
//     buffer(6) state_out [B, W, state_units] (out)   buffer(7) parent_out [B, W] int32 (out)
//     buffer(8) order [B, W] int32 (out, workspace)   buffer(9) BeamTopkParams
//     Grid: B threadgroups; threadgroup: min(256, max(32, W*C rounded up to 32)) threads (any
//     multiple of 32). Each of the W*C candidates counts the
//     candidates before it (f desc, position asc: positions w*C + j increase with the flat
//     index); ranks < W are the result. Then the gathers.
// NaN rows (a NaN or +inf logit, all -inf), -inf scores and +inf scores need no special case:
// the expression gives the reference's NaN / -inf values and the key order the reference's ranks.
#include "common.h"

// The reference's candidate value, operation for operation.
inline float candidate(float s, float x, float m, float logsum) { return s + ((x - m) - logsum); }

// Error-free sum of two floats (Knuth's TwoSum): a + b == s + e exactly.
inline void two_sum(float a, float b, thread float& s, thread float& e) {
  s = a + b;
  const float bb = s - a;
  e = (a - (s - bb)) + (b - bb);
}

template <typename T>
inline float cand_at(device const T* row, long i, float s, float m, float logsum) {
  return candidate(s, to_float(row[i]), m, logsum);
}

template <typename T>
[[kernel]] void beam_topk_rows(device const T* logits [[buffer(0)]],
                               device const float* scores [[buffer(1)]],
                               device float* row_f [[buffer(2)]],
                               device int* row_i [[buffer(3)]],
                               constant BeamTopkParams& p [[buffer(4)]],
                               uint r [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint nthreads [[threads_per_threadgroup]]) {
  threadgroup atomic_uint hist[256];
  threadgroup int scratch[32];
  threadgroup uint uscratch[32];
  threadgroup float hi_s[32];
  threadgroup float lo_s[32];
  threadgroup uint digit[2];
  const long V = p.V;
  const int C = p.C;
  device const T* row = logits + long(r) * V;
  const float s = scores[r];

  // max: the largest order key (a NaN gives the NaN key, and a NaN max makes every value NaN)
  uint kmax = 0;
  for (long i = tid; i < V; i += nthreads) kmax = max(kmax, order_key(to_float(row[i])));
  const float m = key_to_float(group_max_uint(kmax, uscratch, tid, nthreads));
  // sum of exp(x - m) as an unevaluated float pair (hi + lo), ~double accuracy
  float hi = 0.0f, lo = 0.0f;
  for (long i = tid; i < V; i += nthreads) {
    float t, e;
    two_sum(hi, precise::exp(to_float(row[i]) - m), t, e);
    hi = t;
    lo += e;
  }
  for (uint off = 16; off > 0; off >>= 1) {
    const float oh = simd_shuffle_xor(hi, off);
    const float ol = simd_shuffle_xor(lo, off);
    float t, e;
    two_sum(hi, oh, t, e);
    hi = t;
    lo = lo + ol + e;
  }
  if (tid % 32 == 0) {
    hi_s[tid / 32] = hi;
    lo_s[tid / 32] = lo;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  hi = 0.0f;
  lo = 0.0f;
  for (uint k = 0; k < (nthreads + 31) / 32; ++k) {
    float t, e;
    two_sum(hi, hi_s[k], t, e);
    hi = t;
    lo += lo_s[k] + e;
  }
  const float logsum = precise::log(hi + lo);

  // radix select of the C-th largest key of f: after 4 passes `prefix` is that key and `need`
  // the number of elements equal to it that are taken (the lowest positions)
  uint prefix = 0, pmask = 0;
  int need = C;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (uint i = tid; i < 256; i += nthreads) atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (long i = tid; i < V; i += nthreads) {
      const uint u = order_key(cand_at(row, i, s, m, logsum));
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
    threadgroup_barrier(mem_flags::mem_threadgroup);  // digit is rewritten by the next pass
  }

  // ordered compaction: kScanItems consecutive positions per thread and tile, in position order
  const uint thr = prefix;
  int taken = 0, eq_seen = 0;
  const long tile = long(nthreads) * kScanItems;
  for (long t0 = 0; t0 < V && taken < C; t0 += tile) {
    const long first = t0 + long(tid) * kScanItems;
    int eq = 0;
    for (int j = 0; j < kScanItems && first + j < V; ++j) {
      eq += order_key(cand_at(row, first + j, s, m, logsum)) == thr;
    }
    int eq_total = 0, sel_total = 0;
    const int eq_before = eq_seen + group_prefix_sum(eq, scratch, tid, nthreads, eq_total);
    int sel = 0;
    for (int j = 0, e = eq_before; j < kScanItems && first + j < V; ++j) {
      const uint u = order_key(cand_at(row, first + j, s, m, logsum));
      sel += u > thr || (u == thr && e++ < need);
    }
    int pos = taken + group_prefix_sum(sel, scratch, tid, nthreads, sel_total);
    for (int j = 0, e = eq_before; j < kScanItems && first + j < V; ++j) {
      const float f = cand_at(row, first + j, s, m, logsum);
      const uint u = order_key(f);
      if (u > thr || (u == thr && e++ < need)) {
        row_f[long(r) * p.W + pos] = f;
        row_i[long(r) * p.W + pos] = int(first + j);
        ++pos;
      }
    }
    eq_seen += eq_total;
    taken += sel_total;
  }
}

[[kernel]] void beam_topk_merge(device const float* row_f [[buffer(0)]],
                                device const int* row_i [[buffer(1)]],
                                device const int* tokens [[buffer(2)]],
                                device const ushort* state [[buffer(3)]],
                                device float* scores_out [[buffer(4)]],
                                device int* tokens_out [[buffer(5)]],
                                device ushort* state_out [[buffer(6)]],
                                device int* parent_out [[buffer(7)]],
                                device int* order [[buffer(8)]],
                                constant BeamTopkParams& p [[buffer(9)]],
                                uint b [[threadgroup_position_in_grid]],
                                uint tid [[thread_position_in_threadgroup]],
                                uint nthreads [[threads_per_threadgroup]]) {
  const long W = p.W, C = p.C, L = p.L, n = W * C, D = p.state_units;
  device const float* f = row_f + long(b) * W * W;  // candidate q = w*C + j at f[w*W + j]
  device const int* idx = row_i + long(b) * W * W;
  device int* ord = order + long(b) * W;
  for (long q = tid; q < n; q += nthreads) {
    const uint kq = order_key(f[(q / C) * W + q % C]);
    long rank = 0;
    for (long o = 0; o < n && rank < W; ++o) {
      const uint ko = order_key(f[(o / C) * W + o % C]);
      rank += ko > kq || (ko == kq && o < q);
    }
    if (rank < W) ord[rank] = int(q);
  }
  threadgroup_barrier(mem_flags::mem_device);
  for (long j = tid; j < W; j += nthreads) {
    const long q = ord[j], w = q / C;
    scores_out[long(b) * W + j] = f[w * W + q % C];
    parent_out[long(b) * W + j] = int(w);
  }
  for (long e = tid; e < W * L; e += nthreads) {
    const long j = e / L, t = e % L, q = ord[j], w = q / C;
    tokens_out[(long(b) * W + j) * L + t] = t == p.step ? idx[w * W + q % C] : tokens[(long(b) * W + w) * L + t];
  }
  for (long e = tid; e < W * D; e += nthreads) {
    const long j = e / D, k = e % D, w = ord[j] / C;
    state_out[(long(b) * W + j) * D + k] = state[(long(b) * W + w) * D + k];
  }
}

instantiate_kernel("beam_topk_rows_float32", beam_topk_rows, float)
instantiate_kernel("beam_topk_rows_float16", beam_topk_rows, half)
instantiate_kernel("beam_topk_rows_bfloat16", beam_topk_rows, bf16)
