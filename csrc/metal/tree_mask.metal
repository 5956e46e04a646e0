// tree_mask: ancestor-or-self mask of each row's trie.
//
// Kernels (one threadgroup per batch row; threads own whole mask rows):
//   tree_mask_bool    buffer(0) node_parent [B, N] int32   buffer(1) num_nodes [B] int32
//                     buffer(2) mask [B, N, N] bool (out)  buffer(3) TreeMaskParams {N, words}
//   tree_mask_packed  as tree_mask_bool with buffer(2) words [B, N, words] int32 (out), bit j % 32
//                     of word j / 32 set when node j is an ancestor-or-self of node i (LSB first)
// Grid: B threadgroups; threadgroup: min(256, max(32, N rounded up to 32)) threads (any multiple
// of 32 works).
// Rows >= num_nodes[b] see only themselves; a parent that is not a lower node index ends the
// ancestor walk (as if -1), so malformed input never reads out of bounds.
#include "common.h"

[[kernel]] void tree_mask_bool(device const int* node_parent [[buffer(0)]],
                               device const int* num_nodes [[buffer(1)]],
                               device bool* mask [[buffer(2)]],
                               constant TreeMaskParams& p [[buffer(3)]],
                               uint b [[threadgroup_position_in_grid]],
                               uint tid [[thread_position_in_threadgroup]],
                               uint nthreads [[threads_per_threadgroup]]) {
  const long N = p.N;
  const long n_valid = num_nodes[b];
  device const int* parent = node_parent + long(b) * N;
  for (long i = tid; i < N; i += nthreads) {
    device bool* row = mask + (long(b) * N + i) * N;
    for (long j = 0; j < N; ++j) row[j] = false;
    long j = i;
    while (true) {
      row[j] = true;
      if (i >= n_valid) break;  // padding sees only itself
      const long q = parent[j];
      if (q < 0 || q >= j) break;
      j = q;
    }
  }
}

[[kernel]] void tree_mask_packed(device const int* node_parent [[buffer(0)]],
                                 device const int* num_nodes [[buffer(1)]],
                                 device uint* words [[buffer(2)]],
                                 constant TreeMaskParams& p [[buffer(3)]],
                                 uint b [[threadgroup_position_in_grid]],
                                 uint tid [[thread_position_in_threadgroup]],
                                 uint nthreads [[threads_per_threadgroup]]) {
  const long N = p.N, nw = p.words;
  const long n_valid = num_nodes[b];
  device const int* parent = node_parent + long(b) * N;
  for (long i = tid; i < N; i += nthreads) {
    device uint* row = words + (long(b) * N + i) * nw;
    // ancestors come in decreasing index order, so words complete from high to low
    long w = nw - 1;
    uint acc = 0;
    long j = i;
    while (j >= 0) {
      const long wj = j / 32;
      for (; w > wj; --w) {
        row[w] = acc;
        acc = 0;
      }
      acc |= 1u << uint(j % 32);
      const long q = i < n_valid ? long(parent[j]) : -1;
      j = (q >= 0 && q < j) ? q : -1;
    }
    for (; w >= 0; --w) {
      row[w] = acc;
      acc = 0;
    }
  }
}
