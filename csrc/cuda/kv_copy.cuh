// The in-place accepted-slot copy shared by kv_compact.cu and kv_compact_paged.cu. They differ
// only in where logical slot s of a (layer, K/V, row, head) unit lies, which a Layout supplies:
//   capacity()                 slots per row (S)
//   row(b)                     row b's block table (nullptr when there is none)
//   blocks_ok(t, src, dst)     whether the blocks of slots src and dst (t = row(b)) are valid
//   unit_base(u, h, lk)        per-unit part of the slot index (h: head, lk = layer * 2 + K/V)
//   slot(base, t, s)           index of logical slot s of that unit, in slots from the base pointer
// Thread g owns one vector column of one unit (no other thread touches it, so positions do not
// race); it gathers the accepted sources (cache_len + path_nodes[i], i = 0..accept_len, kChunk at
// a time in registers), then scatters them to cache_len + i. Since path_nodes[i] >= i a source is
// never a destination of an earlier chunk. A second tiny launch advances cache_len after every
// copy has read it (stream order).
#pragma once
#include "cuda/common.cuh"

namespace redrafter::cuda::kv_copy {

constexpr int kChunk = 16;
constexpr int kThreads = 256;

// accept_len of an active row whose values are all in range (the layout's block ids of every slot
// read or written included), else -1: the row is left untouched
template <typename Layout, typename I>
__device__ __forceinline__ int64_t checked_accept(const int32_t* cache_len, const I* path, const I* acc, int64_t b,
                                                  int64_t L, const Layout& lay) {
  const int64_t a = static_cast<int64_t>(acc[b]);
  if (a < 0 || a >= L) return -1;
  const int64_t S = lay.capacity();
  const int64_t c = cache_len[b];
  if (c < 0 || c > S) return -1;
  const int32_t* t = lay.row(b);
  for (int64_t i = 0; i <= a; ++i) {
    const int64_t p = static_cast<int64_t>(path[b * L + i]);
    if (p < i || c + p >= S) return -1;
    if (!lay.blocks_ok(t, c + p, c + i)) return -1;
  }
  return a;
}

template <typename Layout, typename Vec, typename I>
__global__ void __launch_bounds__(kThreads) copy_kernel(Vec* __restrict__ kv, int64_t units, int64_t B, int64_t H, int64_t vecs, Layout lay,
                            const int32_t* __restrict__ cache_len, const I* __restrict__ path,
                            const I* __restrict__ acc, int64_t L) {
  const int64_t total = units * vecs;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < total; g += stride) {
    const int64_t u = g / vecs, col = g % vecs;
    const int64_t h = u % H, b = (u / H) % B, lk = u / (B * H);  // lk = layer * 2 + (0: K, 1: V)
    const int64_t a = checked_accept(cache_len, path, acc, b, L, lay);
    if (a < 0) continue;
    const int64_t base = lay.unit_base(u, h, lk);
    const int32_t* t = lay.row(b);
    const int64_t c0 = cache_len[b];
    const I* p = path + b * L;
    for (int64_t i0 = 0; i0 <= a; i0 += kChunk) {
      Vec r[kChunk];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        if (i0 + k <= a) r[k] = kv[lay.slot(base, t, c0 + static_cast<int64_t>(p[i0 + k])) * vecs + col];
      }
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const int64_t i = i0 + k;
        if (i <= a && static_cast<int64_t>(p[i]) != i) kv[lay.slot(base, t, c0 + i) * vecs + col] = r[k];
      }
    }
  }
}

template <typename Layout, typename I>
__global__ void __launch_bounds__(kThreads) advance_kernel(int32_t* __restrict__ cache_len, const I* __restrict__ path, const I* __restrict__ acc,
                               int64_t B, int64_t L, Layout lay) {
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < B;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t a = checked_accept(cache_len, path, acc, b, L, lay);
    if (a >= 0) cache_len[b] += static_cast<int32_t>(a + 1);
  }
}

template <typename Vec, typename Layout, typename I>
cudaError_t launch_vec(void* kv, int64_t units, int64_t B, int64_t H, int64_t slot_bytes, const Layout& lay,
                       const int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t vecs = slot_bytes / static_cast<int64_t>(sizeof(Vec));
  const int64_t total = units * vecs;
  if (total == 0) return cudaSuccess;
  int64_t blocks = (total + kThreads - 1) / kThreads;
  if (blocks > (int64_t(1) << 20)) blocks = int64_t(1) << 20;  // grid-stride beyond that
  return launch_kernel(copy_kernel<Layout, Vec, I>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream,
                       static_cast<Vec*>(kv), units, B, H, vecs, lay, cache_len, path, acc, L);
}

// The copy with the widest Vec (16, 8, 4, 2 or 1 bytes) that the slot size and the base pointer
// allow, then the cache_len advance.
template <typename Layout, typename I>
cudaError_t launch(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t slot_bytes, const Layout& lay,
                   int32_t* cache_len, const I* path, const I* acc, int64_t L, cudaStream_t stream) {
  const int64_t units = n_layers * 2 * B * H;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(kv);
  cudaError_t e = cudaSuccess;
  if (slot_bytes % 16 == 0 && addr % 16 == 0) {
    e = launch_vec<uint4>(kv, units, B, H, slot_bytes, lay, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 8 == 0 && addr % 8 == 0) {
    e = launch_vec<uint2>(kv, units, B, H, slot_bytes, lay, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 4 == 0 && addr % 4 == 0) {
    e = launch_vec<uint32_t>(kv, units, B, H, slot_bytes, lay, cache_len, path, acc, L, stream);
  } else if (slot_bytes % 2 == 0 && addr % 2 == 0) {
    e = launch_vec<uint16_t>(kv, units, B, H, slot_bytes, lay, cache_len, path, acc, L, stream);
  } else {
    e = launch_vec<uint8_t>(kv, units, B, H, slot_bytes, lay, cache_len, path, acc, L, stream);
  }
  if (e != cudaSuccess) return e;
  const int64_t blocks = (B + kThreads - 1) / kThreads;
  return launch_kernel(advance_kernel<Layout, I>, dim3(static_cast<unsigned>(blocks < 65535 ? blocks : 65535)),
                       dim3(kThreads), 0, stream, cache_len, path, acc, B, L, lay);
}

// The op's entry: path_nodes and accept_len as int32 or int64.
template <typename Layout>
cudaError_t dispatch(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t slot_bytes, const Layout& lay,
                     int32_t* cache_len, const void* path_nodes, const void* accept_len, IndexType index_type,
                     int64_t L, cudaStream_t stream) {
  if (index_type == IndexType::kInt64) {
    return launch(kv, n_layers, B, H, slot_bytes, lay, cache_len, static_cast<const int64_t*>(path_nodes),
                  static_cast<const int64_t*>(accept_len), L, stream);
  }
  return launch(kv, n_layers, B, H, slot_bytes, lay, cache_len, static_cast<const int32_t*>(path_nodes),
                static_cast<const int32_t*>(accept_len), L, stream);
}

}  // namespace redrafter::cuda::kv_copy
