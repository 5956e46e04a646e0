// kv_compact, in place, every layer in one launch: kv [n_layers*2, B, H, S, slot], slot s of unit
// u (one layer, K/V, row, head) at u * S + s. The copy itself (thread per vector column of a unit,
// 16 sources gathered into registers before they are scattered, widest Vec the slot size and the
// base pointer allow, cache_len advanced by a second launch) is cuda/kv_copy.cuh, shared with
// kv_compact_paged.cu.
#include "cuda/kernels.h"
#include "cuda/kv_copy.cuh"

namespace redrafter::cuda {
namespace {

struct Contiguous {
  int64_t S;
  __device__ __forceinline__ int64_t capacity() const { return S; }
  __device__ __forceinline__ const int32_t* row(int64_t) const { return nullptr; }
  __device__ __forceinline__ bool blocks_ok(const int32_t*, int64_t, int64_t) const { return true; }
  __device__ __forceinline__ int64_t unit_base(int64_t u, int64_t, int64_t) const { return u * S; }
  __device__ __forceinline__ int64_t slot(int64_t base, const int32_t*, int64_t s) const { return base + s; }
};

}  // namespace

cudaError_t kv_compact(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t S, int64_t slot_bytes,
                       int32_t* cache_len, const void* path_nodes, const void* accept_len, IndexType index_type,
                       int64_t L, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  return kv_copy::dispatch(kv, n_layers, B, H, slot_bytes, Contiguous{S}, cache_len, path_nodes, accept_len,
                           index_type, L, stream);
}

}  // namespace redrafter::cuda
