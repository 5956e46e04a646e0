// verify_greedy: the longest beam whose draft tokens equal the target's argmax (ties: lowest beam).
//
// Kernel verify_greedy_<dtype> (dtype float32 / float16 / bfloat16; one threadgroup per batch row):
//   buffer(0) logits [B, n_logit_rows, V] (dtype)   buffer(1) beams [B, W, L] int32
//   buffer(2) beam_node [B, W, L] int32
//   buffer(3) accept_len [B] int32 (out)      buffer(4) best_beam [B] int32 (out)
//   buffer(5) path_nodes [B, L] int32 (out)   buffer(6) next_token [B] int32 (out)
//   buffer(7) VerifyParams {n_logit_rows, V, W, L, ...} (sampling fields unused)
// Grid: B threadgroups; threadgroup: 32 * min(W, 32) threads (one simdgroup per beam; simdgroups
// take beams w, w + n_simdgroups, ...; any multiple of 32 up to 1024 is correct).
// A simdgroup walks its beam from the root: argmax over V at the node (lanes stride over V, then
// a shuffle reduction; first maximum on ties, a NaN is the maximum like torch.argmax), one level
// deeper while the draft token equals it. A beam_node outside [0, n_logit_rows) counts as a node whose
// argmax is -1 (acceptance stops there; next_token can be -1). Each simdgroup keeps its best beam;
// simdgroup 0 reduces them in threadgroup memory and writes the outputs.
#include "common.h"

// torch.argmax order: a before b when a is NaN (the first NaN wins) or larger; equal: lower index
inline bool argmax_before(float a, int ia, float b, int ib) {
  if (is_nan(a)) return !is_nan(b) || ia < ib;
  if (is_nan(b)) return false;
  return a > b || (a == b && ia < ib);
}

template <typename T>
int simd_argmax(device const T* row, int V, uint lane) {
  float best = neg_inf();
  int best_i = V;  // sentinel: loses to every real element
  for (int v = int(lane); v < V; v += 32) {
    const float x = to_float(row[v]);
    if (argmax_before(x, v, best, best_i)) {
      best = x;
      best_i = v;
    }
  }
  for (uint off = 16; off > 0; off >>= 1) {
    const float ob = simd_shuffle_xor(best, off);
    const int oi = simd_shuffle_xor(best_i, off);
    if (argmax_before(ob, oi, best, best_i)) {
      best = ob;
      best_i = oi;
    }
  }
  return best_i;
}

// The argmax at `node` of batch row b, -1 when the node is out of range.
template <typename T>
int node_argmax(device const T* logits, long b, constant VerifyParams& p, long node, uint lane) {
  if (node < 0 || node >= p.n_logit_rows) return -1;
  return simd_argmax(logits + (b * p.n_logit_rows + node) * long(p.V), p.V, lane);
}

template <typename T>
[[kernel]] void verify_greedy(device const T* logits [[buffer(0)]],
                              device const int* beams [[buffer(1)]],
                              device const int* beam_node [[buffer(2)]],
                              device int* accept_len [[buffer(3)]],
                              device int* best_beam [[buffer(4)]],
                              device int* path_nodes [[buffer(5)]],
                              device int* next_token [[buffer(6)]],
                              constant VerifyParams& p [[buffer(7)]],
                              uint b [[threadgroup_position_in_grid]],
                              uint tid [[thread_position_in_threadgroup]],
                              uint nthreads [[threads_per_threadgroup]]) {
  threadgroup int sg_len[32];
  threadgroup int sg_beam[32];
  threadgroup int sg_target[32];
  const uint lane = tid % 32u, sg = tid / 32u, n_sg = nthreads / 32u;
  const long W = p.W, L = p.L;
  int best_len = -1, best = int(W), best_target = -1;
  for (long w = sg; w < W; w += n_sg) {
    device const int* t = beams + (long(b) * W + w) * L;
    device const int* nw = beam_node + (long(b) * W + w) * L;
    long len = 0;
    int target = -1;
    while (true) {
      target = node_argmax(logits, b, p, nw[len], lane);  // simdgroup-uniform
      if (len == L - 1 || target < 0 || t[len + 1] != target) break;
      ++len;
    }
    if (int(len) > best_len) {  // strict: a simdgroup sees its beams in increasing order
      best_len = int(len);
      best = int(w);
      best_target = target;
    }
  }
  if (lane == 0) {
    sg_len[sg] = best_len;
    sg_beam[sg] = best;
    sg_target[sg] = best_target;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg != 0) return;  // no barrier follows
  int bl = lane < n_sg ? sg_len[lane] : -1;
  int bb = lane < n_sg ? sg_beam[lane] : int(W);
  int bt = lane < n_sg ? sg_target[lane] : -1;
  for (uint off = 16; off > 0; off >>= 1) {
    const int ol = simd_shuffle_xor(bl, off);
    const int ob = simd_shuffle_xor(bb, off);
    const int ot = simd_shuffle_xor(bt, off);
    if (ol > bl || (ol == bl && ob < bb)) {
      bl = ol;
      bb = ob;
      bt = ot;
    }
  }
  device const int* path = beam_node + (long(b) * W + bb) * L;
  for (long i = lane; i < L; i += 32) path_nodes[long(b) * L + i] = i <= bl ? path[i] : -1;
  if (lane == 0) {
    accept_len[b] = bl;
    best_beam[b] = bb;
    next_token[b] = bt;
  }
}

instantiate_kernel("verify_greedy_float32", verify_greedy, float)
instantiate_kernel("verify_greedy_float16", verify_greedy, half)
instantiate_kernel("verify_greedy_bfloat16", verify_greedy, bf16)
