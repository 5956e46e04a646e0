// kv_compact, in place, every layer in one launch. Thread g owns one vector column c of one
// (layer, K/V, row, head) unit u: bytes [c*sizeof(Vec), (c+1)*sizeof(Vec)) of every slot. It
// gathers the column of the accepted sources (slot cache_len + path_nodes[i], i = 0..accept_len,
// 16 at a time in registers) and then scatters them to slots cache_len + i. No other thread
// touches that column of that unit, so there is no race between positions, and since
// path_nodes[i] >= i a source is never a destination of an earlier chunk of 16. Vec is 16 bytes
// when the slot size and the base pointer allow (8, 4, 2, 1 otherwise). A second tiny launch
// advances cache_len after every copy has read it (stream order).
#include "cuda/common.cuh"
#include "cuda/kernels.h"

namespace redrafter::cuda {
namespace {

constexpr int kChunk = 16;
constexpr int kThreads = 256;

// accept_len of an active row whose values are all in range, else -1 (the row is left untouched)
template <typename I>
__device__ __forceinline__ int64_t checked_accept(const int32_t* cache_len, const I* path, const I* acc, int64_t b,
                                                  int64_t L, int64_t S) {
  const int64_t a = static_cast<int64_t>(acc[b]);
  if (a < 0 || a >= L) return -1;
  const int64_t c = cache_len[b];
  if (c < 0 || c > S) return -1;
  for (int64_t i = 0; i <= a; ++i) {
    const int64_t p = static_cast<int64_t>(path[b * L + i]);
    if (p < i || c + p >= S) return -1;
  }
  return a;
}

template <typename Vec, typename I>
__global__ void kv_compact_kernel(Vec* __restrict__ kv, int64_t units, int64_t B, int64_t H, int64_t S, int64_t vecs,
                                  const int32_t* __restrict__ cache_len, const I* __restrict__ path,
                                  const I* __restrict__ acc, int64_t L) {
  const int64_t total = units * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t u = g / vecs, c = g % vecs;
    const int64_t b = (u / H) % B;
    const int64_t a = checked_accept(cache_len, path, acc, b, L, S);
    if (a < 0) continue;
    Vec* base = kv + (u * S + cache_len[b]) * vecs + c;
    const I* p = path + b * L;
    for (int64_t i0 = 0; i0 <= a; i0 += kChunk) {
      Vec r[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        if (i0 + k <= a) r[k] = base[static_cast<int64_t>(p[i0 + k]) * vecs];
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int64_t i = i0 + k;
        if (i <= a && static_cast<int64_t>(p[i]) != i) base[i * vecs] = r[k];
      }
    }
  }
}

template <typename I>
__global__ void kv_advance_kernel(int32_t* __restrict__ cache_len, const I* __restrict__ path,
                                  const I* __restrict__ acc, int64_t B, int64_t L, int64_t S) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < B;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t a = checked_accept(cache_len, path, acc, b, L, S);
    if (a >= 0) cache_len[b] += static_cast<int32_t>(a + 1);
  }
}

template <typename Vec, typename I>
cudaError_t launch_vec(void* kv, int64_t units, int64_t B, int64_t H, int64_t S, int64_t slot_bytes,
                       const int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t vecs = slot_bytes / static_cast<int64_t>(sizeof(Vec));
  const int64_t total = units * vecs;
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;  // grid-stride beyond that
  return launch_kernel(kv_compact_kernel<Vec, I>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                       static_cast<Vec*>(kv), units, B, H, S, vecs, cache_len, path, acc, L);
}

template <typename I>
cudaError_t launch(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t S, int64_t slot_bytes,
                   int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t units = n_layers * 2 * B * H;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(kv);
  cudaError_t e = cudaSuccess;
  if (slot_bytes % 16 == 0 && addr % 16 == 0) {
    e = launch_vec<uint4>(kv, units, B, H, S, slot_bytes, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 8 == 0 && addr % 8 == 0) {
    e = launch_vec<uint2>(kv, units, B, H, S, slot_bytes, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 4 == 0 && addr % 4 == 0) {
    e = launch_vec<uint32_t>(kv, units, B, H, S, slot_bytes, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 2 == 0 && addr % 2 == 0) {
    e = launch_vec<uint16_t>(kv, units, B, H, S, slot_bytes, cache_len, path, acc, L, stream);
  } else {
    e = launch_vec<uint8_t>(kv, units, B, H, S, slot_bytes, cache_len, path, acc, L, stream);
  }
  if (e != cudaSuccess) return e;
  const int64_t blocks = (B + kThreads - 1) / kThreads;
  return launch_kernel(kv_advance_kernel<I>, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                       dim3(kThreads), 0, stream, cache_len, path, acc, B, L, S);
}

}  // namespace

cudaError_t kv_compact(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t S, int64_t slot_bytes,
                       int32_t* cache_len, const void* path_nodes, const void* accept_len, IndexType index_type,
                       int64_t L, cudaStream_t stream) {
  if (B == 0) return cudaSuccess;
  if (index_type == IndexType::kInt64) {
    return launch(kv, n_layers, B, H, S, slot_bytes, cache_len, static_cast<const int64_t*>(path_nodes),
                  static_cast<const int64_t*>(accept_len), L, stream);
  }
  return launch(kv, n_layers, B, H, S, slot_bytes, cache_len, static_cast<const int32_t*>(path_nodes),
                static_cast<const int32_t*>(accept_len), L, stream);
}

}  // namespace redrafter::cuda
