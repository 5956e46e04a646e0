// kv_compact_paged, in place, every layer in one launch. Layout: kv_pages
// [n_layers, num_blocks, 2, H, block_size, slot] with logical slot s of row b in physical block
// block_table[b, s / block_size] at offset s % block_size. The copy is kv_compact's
// (cuda/kv_copy.cuh); only the slot addresses go through the block table. A source is never a
// destination of an earlier chunk (path_nodes[i] >= i) provided no physical block is reached from
// two (row, logical block) pairs, which is the caller's contract (checked on the CPU, not here: it
// would need a device-wide sort).
#include "cuda/kernels.h"
#include "cuda/kv_copy.cuh"

namespace redrafter::cuda {
namespace {

struct Paged {
  const int32_t* table;  // [B, max_blocks]
  int64_t max_blocks, block_size, num_blocks;
  int64_t H, block_stride;  // slots between physical blocks p and p + 1 of one layer: 2 * H * block_size

  __device__ __forceinline__ int64_t capacity() const { return max_blocks * block_size; }
  __device__ __forceinline__ const int32_t* row(int64_t b) const { return table + b * max_blocks; }
  __device__ __forceinline__ bool blocks_ok(const int32_t* t, int64_t src_slot, int64_t dst_slot) const {
    const int64_t src = t[src_slot / block_size], dst = t[dst_slot / block_size];
    return src >= 0 && src < num_blocks && dst >= 0 && dst < num_blocks;
  }
  __device__ __forceinline__ int64_t unit_base(int64_t, int64_t h, int64_t lk) const {
    return (((lk / 2) * num_blocks * 2 + lk % 2) * H + h) * block_size;
  }
  __device__ __forceinline__ int64_t slot(int64_t base, const int32_t* t, int64_t s) const {
    return base + t[s / block_size] * block_stride + s % block_size;
  }
};

}  // namespace

cudaError_t kv_compact_paged(void* kv_pages, int64_t n_layers, int64_t num_blocks, int64_t H, int64_t block_size,
                             int64_t slot_bytes, const int32_t* block_table, int64_t B, int64_t max_blocks,
                             int32_t* cache_len, const void* path_nodes, const void* accept_len,
                             IndexType index_type, int64_t L, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (num_blocks < 1 || block_size < 1) return cudaErrorInvalidValue;
  const Paged pg{block_table, max_blocks, block_size, num_blocks, H, 2 * H * block_size};
  return kv_copy::dispatch(kv_pages, n_layers, B, H, slot_bytes, pg, cache_len, path_nodes, accept_len, index_type,
                           L, stream);
}

}  // namespace redrafter::cuda
