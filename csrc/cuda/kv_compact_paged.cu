// kv_compact_paged, in place, every layer in one launch. Layout: kv_pages
// [n_layers, num_blocks, 2, H, block_size, slot] with logical slot s of row b in physical block
// block_table[b, s / block_size] at offset s % block_size. As in kv_compact.cu, thread g owns one
// vector column c of one (layer, K/V, row, head) unit and moves the accepted slots of that column
// (sources cache_len + path_nodes[i] -> destinations cache_len + i), 16 sources gathered into
// registers before they are scattered; only the slot addresses go through the block table. A
// source is never a destination of an earlier chunk (path_nodes[i] >= i) provided no physical
// block is reached from two (row, logical block) pairs, which is the caller's contract (checked on
// the CPU, not here: it would need a device-wide sort). Vec is 16 bytes when the slot size and the
// base pointer allow. A second tiny launch advances cache_len after every copy has read it.
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kChunk = 16;
constexpr int kThreads = 256;

struct Paged {
  const int32_t* table;  // [B, max_blocks]
  int64_t max_blocks, block_size, num_blocks;
};

// accept_len of an active row whose values are all in range (block ids of every slot read or
// written included), else -1: the row is left untouched
template <typename I>
__device__ __forceinline__ int64_t checked_accept(const int32_t* cache_len, const I* path, const I* acc, int64_t b,
                                                  int64_t L, const Paged& pg) {
  const int64_t a = static_cast<int64_t>(acc[b]);
  if (a < 0 || a >= L) return -1;
  const int64_t S = pg.max_blocks * pg.block_size;
  const int64_t c = cache_len[b];
  if (c < 0 || c > S) return -1;
  const int32_t* t = pg.table + b * pg.max_blocks;
  for (int64_t i = 0; i <= a; ++i) {
    const int64_t p = static_cast<int64_t>(path[b * L + i]);
    if (p < i || c + p >= S) return -1;
    const int64_t src = t[(c + p) / pg.block_size], dst = t[(c + i) / pg.block_size];
    if (src < 0 || src >= pg.num_blocks || dst < 0 || dst >= pg.num_blocks) return -1;
  }
  return a;
}

template <typename Vec, typename I>
__global__ void kv_compact_paged_kernel(Vec* __restrict__ pages, int64_t units, int64_t B, int64_t H, int64_t vecs,
                                        Paged pg, const int32_t* __restrict__ cache_len, const I* __restrict__ path,
                                        const I* __restrict__ acc, int64_t L) {
  const int64_t total = units * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t bs = pg.block_size;
  const int64_t block_stride = 2 * H * bs;  // slots between physical blocks p and p + 1 of one layer
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t u = g / vecs, col = g % vecs;
    const int64_t h = u % H, b = (u / H) % B, lk = u / (B * H);  // lk = layer * 2 + (0: K, 1: V)
    const int64_t a = checked_accept(cache_len, path, acc, b, L, pg);
    if (a < 0) continue;
    // slot index of logical slot s of this unit: unit_base + table[s / bs] * block_stride + s % bs
    const int64_t unit_base = (((lk / 2) * pg.num_blocks * 2 + lk % 2) * H + h) * bs;
    const int32_t* t = pg.table + b * pg.max_blocks;
    const int64_t c0 = cache_len[b];
    const I* p = path + b * L;
    for (int64_t i0 = 0; i0 <= a; i0 += kChunk) {
      Vec r[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        if (i0 + k <= a) {
          const int64_t s = c0 + static_cast<int64_t>(p[i0 + k]);
          r[k] = pages[(unit_base + t[s / bs] * block_stride + s % bs) * vecs + col];
        }
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int64_t i = i0 + k;
        if (i <= a && static_cast<int64_t>(p[i]) != i) {
          const int64_t s = c0 + i;
          pages[(unit_base + t[s / bs] * block_stride + s % bs) * vecs + col] = r[k];
        }
      }
    }
  }
}

template <typename I>
__global__ void kv_advance_paged_kernel(int32_t* __restrict__ cache_len, const I* __restrict__ path,
                                        const I* __restrict__ acc, int64_t B, int64_t L, Paged pg) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < B;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t a = checked_accept(cache_len, path, acc, b, L, pg);
    if (a >= 0) cache_len[b] += static_cast<int32_t>(a + 1);
  }
}

template <typename Vec, typename I>
cudaError_t launch_vec(void* pages, int64_t units, int64_t B, int64_t H, int64_t slot_bytes, const Paged& pg,
                       const int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t vecs = slot_bytes / static_cast<int64_t>(sizeof(Vec));
  const int64_t total = units * vecs;
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;  // grid-stride beyond that
  return launch_kernel(kv_compact_paged_kernel<Vec, I>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                       stream, static_cast<Vec*>(pages), units, B, H, vecs, pg, cache_len, path, acc, L);
}

template <typename I>
cudaError_t launch(void* pages, int64_t n_layers, int64_t H, int64_t slot_bytes, const Paged& pg, int64_t B,
                   int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t units = n_layers * 2 * B * H;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(pages);
  cudaError_t e = cudaSuccess;
  if (slot_bytes % 16 == 0 && addr % 16 == 0) {
    e = launch_vec<uint4>(pages, units, B, H, slot_bytes, pg, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 8 == 0 && addr % 8 == 0) {
    e = launch_vec<uint2>(pages, units, B, H, slot_bytes, pg, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 4 == 0 && addr % 4 == 0) {
    e = launch_vec<uint32_t>(pages, units, B, H, slot_bytes, pg, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 2 == 0 && addr % 2 == 0) {
    e = launch_vec<uint16_t>(pages, units, B, H, slot_bytes, pg, cache_len, path, acc, L, stream);
  } else {
    e = launch_vec<uint8_t>(pages, units, B, H, slot_bytes, pg, cache_len, path, acc, L, stream);
  }
  if (e != cudaSuccess) return e;
  const int64_t blocks = (B + kThreads - 1) / kThreads;
  return launch_kernel(kv_advance_paged_kernel<I>, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                       dim3(kThreads), 0, stream, cache_len, path, acc, B, L, pg);
}

}  // namespace

cudaError_t kv_compact_paged(void* kv_pages, int64_t n_layers, int64_t num_blocks, int64_t H, int64_t block_size,
                             int64_t slot_bytes, const int32_t* block_table, int64_t B, int64_t max_blocks,
                             int32_t* cache_len, const void* path_nodes, const void* accept_len,
                             IndexType index_type, int64_t L, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (num_blocks < 1 || block_size < 1) return cudaErrorInvalidValue;
  const Paged pg{block_table, max_blocks, block_size, num_blocks};
  if (index_type == IndexType::kInt64) {
    return launch(kv_pages, n_layers, H, slot_bytes, pg, B, cache_len, static_cast<const int64_t*>(path_nodes),
                  static_cast<const int64_t*>(accept_len), L, stream);
  }
  return launch(kv_pages, n_layers, H, slot_bytes, pg, B, cache_len, static_cast<const int32_t*>(path_nodes),
                static_cast<const int32_t*>(accept_len), L, stream);
}

}  // namespace redrafter::cuda
