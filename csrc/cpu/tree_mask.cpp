#include "cpu/kernels.h"

#include <cstring>

namespace redrafter::cpu {

// Nodes are topologically ordered (parent < child), so row i is row parent(i) plus bit i: one
// pass, O(N^2) bytes or O(N^2/32) words per trie, no recursion and no allocation.
template <typename I>
void tree_mask_bool(const I* node_parent, const I* num_nodes, int64_t N, bool* mask, int64_t row_begin,
                    int64_t row_end) {
  for (int64_t b = row_begin; b < row_end; ++b) {
    const I* parent = node_parent + b * N;
    bool* m = mask + b * N * N;
    const int64_t n_valid = static_cast<int64_t>(num_nodes[b]);
    for (int64_t i = 0; i < N; ++i) {
      bool* row = m + i * N;
      const int64_t p = i < n_valid ? static_cast<int64_t>(parent[i]) : -1;
      if (p >= 0) {
        std::memcpy(row, m + p * N, static_cast<size_t>(i));  // ancestors all precede i
        std::memset(row + i, 0, static_cast<size_t>(N - i));
      } else {
        std::memset(row, 0, static_cast<size_t>(N));
      }
      row[i] = true;
    }
  }
}

template <typename I>
void tree_mask_packed(const I* node_parent, const I* num_nodes, int64_t N, int32_t* words,
                      int64_t row_begin, int64_t row_end) {
  const int64_t nw = (N + 31) / 32;
  for (int64_t b = row_begin; b < row_end; ++b) {
    const I* parent = node_parent + b * N;
    uint32_t* m = reinterpret_cast<uint32_t*>(words) + b * N * nw;
    const int64_t n_valid = static_cast<int64_t>(num_nodes[b]);
    for (int64_t i = 0; i < N; ++i) {
      uint32_t* row = m + i * nw;
      const int64_t p = i < n_valid ? static_cast<int64_t>(parent[i]) : -1;
      if (p >= 0) {
        std::memcpy(row, m + p * nw, static_cast<size_t>(nw) * sizeof(uint32_t));
      } else {
        std::memset(row, 0, static_cast<size_t>(nw) * sizeof(uint32_t));
      }
      row[i / 32] |= 1u << (i % 32);
    }
  }
}

template void tree_mask_bool<int32_t>(const int32_t*, const int32_t*, int64_t, bool*, int64_t, int64_t);
template void tree_mask_bool<int64_t>(const int64_t*, const int64_t*, int64_t, bool*, int64_t, int64_t);
template void tree_mask_packed<int32_t>(const int32_t*, const int32_t*, int64_t, int32_t*, int64_t,
                                        int64_t);
template void tree_mask_packed<int64_t>(const int64_t*, const int64_t*, int64_t, int32_t*, int64_t,
                                        int64_t);

}  // namespace redrafter::cpu
