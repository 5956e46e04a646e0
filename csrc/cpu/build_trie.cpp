// Trie of the beams' shared prefixes. A position of beam w is a new node unless an earlier beam
// shares the draft prefix up to it; the earlier beam with the longest common prefix already
// carries the nodes of that prefix (every beam sharing a prefix carries the same node for it), so
// beam w copies those and numbers the rest consecutively: first occurrence, beam-major then depth,
// exactly the reference's numbering. O(W^2 L) compares per row, no allocation.
#include <cstring>

#include "cpu/kernels.h"

namespace redrafter::cpu {

template <typename I>
void build_trie(const I* beams, int64_t W, int64_t L, int32_t* node_token, int32_t* node_parent,
                int32_t* node_depth, int32_t* beam_node, int32_t* num_nodes, int64_t row_begin,
                int64_t row_end) {
  const int64_t N = 1 + W * (L - 1);
  for (int64_t b = row_begin; b < row_end; ++b) {
    const I* beam = beams + b * W * L;
    int32_t* bn = beam_node + b * W * L;
    int32_t* token = node_token + b * N;
    int32_t* parent = node_parent + b * N;
    int32_t* depth = node_depth + b * N;
    token[0] = static_cast<int32_t>(beam[0]);  // the root: beam 0's guaranteed token
    parent[0] = -1;
    depth[0] = 0;
    int32_t next = 1;
    for (int64_t w = 0; w < W; ++w) {
      const I* t = beam + w * L;
      int32_t* nw = bn + w * L;
      nw[0] = 0;
      // draft positions 1..shared are nodes of the earlier beam `from`
      int64_t shared = 0, from = -1;
      for (int64_t v = 0; v < w && shared < L - 1; ++v) {
        const I* u = beam + v * L;
        int64_t k = 1;
        while (k < L && u[k] == t[k]) ++k;
        if (k - 1 > shared) {
          shared = k - 1;
          from = v;
        }
      }
      if (shared > 0) std::memcpy(nw + 1, bn + from * L + 1, static_cast<size_t>(shared) * sizeof(int32_t));
      for (int64_t d = shared + 1; d < L; ++d) {
        const int32_t n = next++;
        nw[d] = n;
        token[n] = static_cast<int32_t>(t[d]);
        parent[n] = nw[d - 1];
        depth[n] = static_cast<int32_t>(d);
      }
    }
    num_nodes[b] = next;
    for (int64_t n = next; n < N; ++n) {  // padding: token 0, parent -1, depth 0
      token[n] = 0;
      parent[n] = -1;
      depth[n] = 0;
    }
  }
}

template void build_trie<int32_t>(const int32_t*, int64_t, int64_t, int32_t*, int32_t*, int32_t*, int32_t*,
                                  int32_t*, int64_t, int64_t);
template void build_trie<int64_t>(const int64_t*, int64_t, int64_t, int32_t*, int32_t*, int32_t*, int32_t*,
                                  int32_t*, int64_t, int64_t);

}  // namespace redrafter::cpu
