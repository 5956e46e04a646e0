// ngram_lookup: prompt-lookup drafts (reference.ngram_lookup), the design of
// csrc/cuda/ngram_lookup.cu.
//
// Kernel ngram_lookup (one threadgroup per batch row):
//   buffer(0) tokens [B, S] int32   buffer(1) length [B] int32
//   buffer(2) drafts [B, m] int32 (out)   buffer(3) NgramLookupParams {S, max_n, m}
// Grid: B threadgroups; threadgroup: min(256, max(32, S rounded up to 32)) threads (any multiple
// of 32 is correct: the first min(size, 256) threads stride over the candidate ends, the rest
// only write drafts).
// Each thread scans a strided share of the candidate ends e of an occurrence (e <= n_b - 2, so a
// continuation token exists) and keeps the best key run * (S + 1) + e, run the number of trailing
// tokens at e equal to the row's last ones (at most max_n); one max-reduce in threadgroup memory
// then picks the longest key and, among equals, the latest occurrence (the CPU kernel's choice),
// and the threads write the m drafts, repeated with the match's period. A length outside [0, S]
// is clamped into it (values cannot be checked before evaluation), so nothing is read out of
// bounds; a row without an occurrence gets -1s.
#include "common.h"

constant constexpr uint kNgramMaxThreads = 256;

[[kernel]] void ngram_lookup(device const int* tokens [[buffer(0)]],
                             device const int* length [[buffer(1)]],
                             device int* drafts [[buffer(2)]],
                             constant NgramLookupParams& p [[buffer(3)]],
                             uint b [[threadgroup_position_in_grid]],
                             uint tid [[thread_position_in_threadgroup]],
                             uint nthreads [[threads_per_threadgroup]]) {
  threadgroup long best[kNgramMaxThreads];
  const long S = p.S, max_n = p.max_n, m = p.m;
  device const int* t = tokens + long(b) * S;
  const long raw = length[b];
  const long n_b = raw < 0 ? 0 : (raw > S ? S : raw);  // out-of-range lengths are clamped
  const long cap = max_n < n_b - 1 ? max_n : n_b - 1;  // the longest key that can occur earlier
  const uint used = min(nthreads, kNgramMaxThreads);   // threads with a slot in best[]
  long mine = 0;  // 0: no occurrence (a match has run >= 1, so its key is >= S + 1)
  if (tid < used) {
    for (long e = tid; e <= n_b - 2; e += used) {
      const long limit = cap < e + 1 ? cap : e + 1;
      long run = 0;
      while (run < limit && t[e - run] == t[n_b - 1 - run]) ++run;
      const long key = run > 0 ? run * (S + 1) + e : 0;
      mine = key > mine ? key : mine;
    }
    best[tid] = mine;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  // tree max over the first `used` slots (any count <= kNgramMaxThreads: after the step of width
  // h, slot i < h holds the max of slots i and i + h)
  for (uint half = kNgramMaxThreads / 2; half > 0; half /= 2) {
    if (tid < half && tid + half < used && best[tid + half] > best[tid]) best[tid] = best[tid + half];
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  const long top = best[0];
  const long q = top % (S + 1) + 1, period = n_b - q;  // period >= 1 when top != 0
  device int* out = drafts + long(b) * m;
  for (long k = tid; k < m; k += nthreads) out[k] = top == 0 ? -1 : t[q + k % period];
}
