// Torch-free CPU kernels (raw pointers). Each processes rows [row_begin, row_end) so that the
// launcher can split rows across threads; inputs are assumed validated by the launcher.
#pragma once
#include <cstdint>

namespace redrafter::cpu {

// Ancestor-or-self mask of a trie. node_parent [B, N] (-1: root/padding, parent < child),
// num_nodes [B]. Bool layout: mask [B, N, N]. Packed: words [B, N, ceil(N/32)], LSB first.
template <typename I>
void tree_mask(const I* node_parent, const I* num_nodes, int64_t N, bool* mask, int64_t row_begin,
               int64_t row_end);
template <typename I>
void tree_mask_packed(const I* node_parent, const I* num_nodes, int64_t N, int32_t* words,
                      int64_t row_begin, int64_t row_end);

}  // namespace redrafter::cpu
