// In-place KV compaction. For one (layer, K/V, row, head) unit the cache is S contiguous slots of
// head_dim values; slot cache_len + path[i] moves to slot cache_len + i for i = 0..accept_len.
// path[i] >= i, so every source lies at or after its destination and after every earlier
// destination: copying in increasing i never reads a slot already overwritten. Consecutive path
// nodes form one run copied by a single memmove (a run may overlap itself).
#include <cstring>

#include "cpu/kernels.h"

namespace redrafter::cpu {

template <typename I>
void kv_compact(uint8_t* kv, int64_t B, int64_t H, int64_t S, int64_t slot_bytes, const int32_t* cache_len,
                const I* path_nodes, int64_t L, const I* accept_len, int64_t unit_begin, int64_t unit_end) {
  for (int64_t u = unit_begin; u < unit_end; ++u) {
    const int64_t b = (u / H) % B;
    const int64_t acc = static_cast<int64_t>(accept_len[b]);
    if (acc < 0) continue;  // inactive row: untouched
    uint8_t* base = kv + (u * S + cache_len[b]) * slot_bytes;
    const I* path = path_nodes + b * L;
    for (int64_t i = 0; i <= acc;) {
      const int64_t src = static_cast<int64_t>(path[i]);
      int64_t run = 1;
      while (i + run <= acc && static_cast<int64_t>(path[i + run]) == src + run) ++run;
      if (src != i) {
        std::memmove(base + i * slot_bytes, base + src * slot_bytes, static_cast<size_t>(run * slot_bytes));
      }
      i += run;
    }
  }
}

template <typename I>
void kv_compact_advance(int32_t* cache_len, const I* accept_len, int64_t B) {
  for (int64_t b = 0; b < B; ++b) {
    if (accept_len[b] >= 0) cache_len[b] += static_cast<int32_t>(accept_len[b]) + 1;
  }
}

template void kv_compact<int32_t>(uint8_t*, int64_t, int64_t, int64_t, int64_t, const int32_t*, const int32_t*,
                                  int64_t, const int32_t*, int64_t, int64_t);
template void kv_compact<int64_t>(uint8_t*, int64_t, int64_t, int64_t, int64_t, const int32_t*, const int64_t*,
                                  int64_t, const int64_t*, int64_t, int64_t);
template void kv_compact_advance<int32_t>(int32_t*, const int32_t*, int64_t);
template void kv_compact_advance<int64_t>(int32_t*, const int64_t*, int64_t);

}  // namespace redrafter::cpu
