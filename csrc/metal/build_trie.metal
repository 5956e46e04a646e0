// build_trie: merge the beams' shared prefixes into a trie (node order: first occurrence,
// beam-major then depth, like reference.build_trie).
//
// Kernel build_trie (one threadgroup per batch row):
//   buffer(0) beams [B, W, L] int32
//   buffer(1) node_token [B, N] int32 (out)   buffer(2) node_parent [B, N] int32 (out)
//   buffer(3) node_depth [B, N] int32 (out)   buffer(4) beam_node [B, W, L] int32 (out)
//   buffer(5) num_nodes [B] int32 (out)       buffer(6) BuildTrieParams {W, L, N}
// Grid: B threadgroups; threadgroup: min(1024, max(32, W*(L-1) rounded up to 32)) threads (a
// multiple of 32; any such size is correct, positions are tiled over the threads).
// One thread per draft position (w, d) finds its owner, the lowest beam sharing the draft prefix
// 1..d. Owned positions are new nodes, numbered in flat order with a group prefix count; beam_node
// (device memory, made visible by mem_device barriers) holds -1-owner for shared positions until
// pass 2 copies the owner's node. node_parent first holds the flat position of each new node and
// is resolved in pass 3, so no threadgroup memory scales with W or L.
#include "common.h"

[[kernel]] void build_trie(device const int* beams [[buffer(0)]],
                           device int* node_token [[buffer(1)]],
                           device int* node_parent [[buffer(2)]],
                           device int* node_depth [[buffer(3)]],
                           device int* beam_node [[buffer(4)]],
                           device int* num_nodes [[buffer(5)]],
                           constant BuildTrieParams& p [[buffer(6)]],
                           uint b [[threadgroup_position_in_grid]],
                           uint tid [[thread_position_in_threadgroup]],
                           uint nthreads [[threads_per_threadgroup]]) {
  threadgroup int scratch[32];
  const long W = p.W, L = p.L, N = p.N, P = W * (L - 1);
  device const int* tok = beams + long(b) * W * L;
  device int* node = beam_node + long(b) * W * L;
  device int* ntok = node_token + long(b) * N;
  device int* npar = node_parent + long(b) * N;
  device int* ndep = node_depth + long(b) * N;

  // pass 1: owners; new positions get consecutive ids in flat order
  int next = 1;
  for (long t0 = 0; t0 < P; t0 += nthreads) {
    const long t = t0 + tid;
    bool fresh = false;
    long w = 0, d = 0, owner = 0;
    if (t < P) {
      w = t / (L - 1);
      d = t % (L - 1) + 1;
      owner = w;
      for (long v = 0; v < w && owner == w; ++v) {
        long k = 1;
        while (k <= d && tok[v * L + k] == tok[w * L + k]) ++k;
        if (k > d) owner = v;
      }
      fresh = owner == w;
    }
    int total = 0;
    const int rank = group_prefix_sum(fresh ? 1 : 0, scratch, tid, nthreads, total);
    if (fresh) {
      const int n = next + rank;
      node[w * L + d] = n;
      ntok[n] = tok[w * L + d];
      npar[n] = int(w * L + d);  // resolved in pass 3
      ndep[n] = int(d);
    } else if (t < P) {
      node[w * L + d] = -1 - int(owner);
    }
    next += total;
  }
  for (long w = tid; w < W; w += nthreads) node[w * L] = 0;
  threadgroup_barrier(mem_flags::mem_device);
  // pass 2: shared positions take the owner's node (a new node, final since pass 1)
  for (long t = tid; t < P; t += nthreads) {
    const long w = t / (L - 1), d = t % (L - 1) + 1;
    const int n = node[w * L + d];
    if (n < 0) node[w * L + d] = node[(-1 - long(n)) * L + d];
  }
  threadgroup_barrier(mem_flags::mem_device);
  // pass 3: parents of the new nodes (the node one position earlier on the same beam); padding
  for (long n = 1 + tid; n < N; n += nthreads) {
    if (n < next) {
      npar[n] = node[npar[n] - 1];
    } else {
      ntok[n] = 0;
      npar[n] = -1;
      ndep[n] = 0;
    }
  }
  if (tid == 0) {
    ntok[0] = tok[0];  // the root: beam 0's guaranteed token
    npar[0] = -1;
    ndep[0] = 0;
    num_nodes[b] = next;
  }
}
