// In-place KV compaction on a paged cache. Logical slot s of row b lives in physical block
// block_table[b, s / block_size] at offset s % block_size; for one (layer, K/V, row, head) unit a
// slot is slot_bytes contiguous bytes. Slot cache_len + path[i] moves to slot cache_len + i for
// i = 0..accept_len. path[i] >= i and the launcher has checked that no physical block is reached
// from two different logical blocks, so (as in the contiguous kernel) copying in increasing i never
// reads a slot already overwritten, and source and destination never overlap: one memcpy per slot
// (a run of consecutive slots may cross a block boundary, so runs are not merged).
#include <cstring>

#include "cpu/kernels.h"

namespace redrafter::cpu {

template <typename I>
void kv_compact_paged(uint8_t* pages, int64_t num_blocks, int64_t B, int64_t H, int64_t block_size,
                      int64_t slot_bytes, const int32_t* block_table, int64_t max_blocks, const int32_t* cache_len,
                      const I* path_nodes, int64_t L, const I* accept_len, int64_t unit_begin, int64_t unit_end) {
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t h = u % H, b = (u / H) % B, lk = u / (B * H);  // lk = layer * 2 + (0: K, 1: V)
    const int64_t acc = static_cast<int64_t>(accept_len[b]);
    if (acc < 0) continue;  // inactive row: untouched
    const int64_t layer = lk / 2, k = lk % 2;
    const int32_t* table = block_table + b * max_blocks;
    const I* path = path_nodes + b * L;
    const int64_t c = cache_len[b];
    // byte address of logical slot s of this unit
    auto slot = [&](int64_t s) {
      const int64_t block = table[s / block_size];
      return pages + ((((layer * num_blocks + block) * 2 + k) * H + h) * block_size + s % block_size) * slot_bytes;
    };
    for (int64_t i = 0; i <= acc; ++i) {
      const int64_t src = static_cast<int64_t>(path[i]);
      if (src != i) std::memcpy(slot(c + i), slot(c + src), static_cast<size_t>(slot_bytes));
    }
  }
}

template void kv_compact_paged<int32_t>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                        int64_t, const int32_t*, const int32_t*, int64_t, const int32_t*, int64_t,
                                        int64_t);
template void kv_compact_paged<int64_t>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int64_t, const int32_t*,
                                        int64_t, const int32_t*, const int64_t*, int64_t, const int64_t*, int64_t,
                                        int64_t);

}  // namespace redrafter::cpu
