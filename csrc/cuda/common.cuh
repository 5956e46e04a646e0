// Helpers shared by every .cu kernel. Kernels take dynamic shared memory only through
// dynamic_smem<T>() and are launched only through launch_kernel(), so that the host-emulation
// shim (tests/shim/cuda_shim.h, selected by REDRAFTER_EMULATE) can replace both and run the same
// file on the CPU. Static `__shared__` declarations are not used (the shim cannot provide them).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/types.h"

namespace redrafter::cuda {

template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
#ifdef REDRAFTER_EMULATE
  return reinterpret_cast<T*>(::redrafter_emu::smem());
#else
  extern __shared__ __align__(16) unsigned char redrafter_smem[];
  return reinterpret_cast<T*>(redrafter_smem);
#endif
}

template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  if (smem_bytes > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem_bytes));
    if (e != cudaSuccess) return e;
  }
  return cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

// The same launch with a name: the emulator's traffic report lists the launch under it (nvcc: the
// name is unused).
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                          cudaStream_t stream, Args... args) {
#ifdef REDRAFTER_EMULATE
  ::redrafter_emu::traffic_name_next(name);
#else
  (void)name;
#endif
  return launch_kernel(kernel, grid, block, smem_bytes, stream, args...);
}

// Global-memory access helpers. Kernels that go through them (verify_greedy, verify_sample,
// beam_topk) have their traffic counted by the emulator (bytes per width, per buffer, per launch:
// bench/traffic.py) and their alignment checked; under nvcc they are plain loads and stores.
template <typename T>
__device__ __forceinline__ T ld_global(const T* p) {
#ifdef REDRAFTER_EMULATE
  ::redrafter_emu::global_access(p, sizeof(T), alignof(T), false);
#endif
  return *p;
}
template <typename T>
__device__ __forceinline__ void st_global(T* p, const T& v) {
#ifdef REDRAFTER_EMULATE
  ::redrafter_emu::global_access(p, sizeof(T), alignof(T), true);
#endif
  *p = v;
}

constexpr unsigned kFullMask = 0xffffffffu;

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

__device__ __forceinline__ float bits_to_float(uint32_t u) { return __uint_as_float(u); }
__device__ __forceinline__ uint32_t float_to_bits(float f) { return __float_as_uint(f); }

// Exact conversions to float.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(BFloat16 x) { return bits_to_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ float to_float(Half x) {
  const uint32_t sign = uint32_t(x.bits & 0x8000u) << 16;
  const uint32_t exp = (x.bits >> 10) & 0x1fu;
  uint32_t mant = x.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_float(sign);
  int e = 113;  // subnormal: normalise
  while (!(mant & 0x400u)) {
    mant <<= 1;
    --e;
  }
  return bits_to_float(sign | (uint32_t(e) << 23) | ((mant & 0x3ffu) << 13));
}

__device__ __forceinline__ bool is_nan(float x) { return x != x; }

// Element j of a 16-byte word holding 16 / sizeof(T) consecutive elements (little-endian).
template <typename T>
__device__ __forceinline__ float vec_elem(const uint4& v, int j) {
  const uint32_t w = j * int(sizeof(T)) / 4 == 0 ? v.x : j * int(sizeof(T)) / 4 == 1 ? v.y
                   : j * int(sizeof(T)) / 4 == 2 ? v.z : v.w;
  if constexpr (sizeof(T) == 4) {
    return bits_to_float(w);
  } else {
    return to_float(T{static_cast<uint16_t>(w >> (16 * (j & 1)))});
  }
}

// Calls f(i, x) for every element i in [lo, hi) of `base` (x = to_float(base[i])), the block's
// threads striding over 16-byte words: elements before the first 16-byte boundary and after the
// last are loaded singly, the rest as 16-byte words, four words in flight per thread. The order in
// which one thread sees its elements is not the index order.
template <typename T, typename F>
__device__ __forceinline__ void block_for_each(const T* __restrict__ base, int64_t lo, int64_t hi, F&& f) {
  constexpr int64_t E = 16 / static_cast<int64_t>(sizeof(T));
  const int64_t n = hi - lo;
  const int64_t mis = static_cast<int64_t>((reinterpret_cast<uintptr_t>(base + lo) & 15u) / sizeof(T));
  int64_t head = mis == 0 ? 0 : E - mis;
  head = head < n ? head : n;
  const int64_t vlo = lo + head, nvec = (hi - vlo) / E, vhi = vlo + nvec * E;
  const int64_t t = threadIdx.x, bd = blockDim.x;
  if (t < head) f(lo + t, to_float(ld_global(base + lo + t)));
  if (t < hi - vhi) f(vhi + t, to_float(ld_global(base + vhi + t)));
  const uint4* vp = reinterpret_cast<const uint4*>(base + vlo);
  int64_t k = t;
  for (; k + 3 * bd < nvec; k += 4 * bd) {
    const uint4 a = ld_global(vp + k), b = ld_global(vp + k + bd), c = ld_global(vp + k + 2 * bd),
                d = ld_global(vp + k + 3 * bd);
#pragma unroll
    for (int j = 0; j < E; ++j) f(vlo + k * E + j, vec_elem<T>(a, j));
#pragma unroll
    for (int j = 0; j < E; ++j) f(vlo + (k + bd) * E + j, vec_elem<T>(b, j));
#pragma unroll
    for (int j = 0; j < E; ++j) f(vlo + (k + 2 * bd) * E + j, vec_elem<T>(c, j));
#pragma unroll
    for (int j = 0; j < E; ++j) f(vlo + (k + 3 * bd) * E + j, vec_elem<T>(d, j));
  }
  for (; k < nvec; k += bd) {
    const uint4 a = ld_global(vp + k);
#pragma unroll
    for (int j = 0; j < E; ++j) f(vlo + k * E + j, vec_elem<T>(a, j));
  }
}

// A float's position in the order of torch.sort(descending=True): larger floats give larger keys,
// every NaN the largest key (NaNs compare equal, so the index breaks their ties).
__device__ __forceinline__ uint32_t order_key(float x) {
  if (is_nan(x)) return 0xffffffffu;
  const uint32_t u = float_to_bits(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ unsigned lane_id() { return threadIdx.x & 31u; }

// Second half of the block_prefix_* scans, once one lane of each warp has written its warp's
// total to scratch[warp]: the sum over the warps before this thread's, and the block total.
__device__ __forceinline__ int warps_before(const int* scratch, int* total) {
  const unsigned warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
  __syncthreads();
  int before = 0, all = 0;
  for (unsigned w = 0; w < n_warps; ++w) {
    const int c = scratch[w];
    before += w < warp ? c : 0;
    all += c;
  }
  __syncthreads();  // scratch may be reused at once
  *total = all;
  return before;
}

// Exclusive prefix count of `flag` over the threads of the block in threadIdx.x order, and the
// block total. Every thread of the block must call it (blockDim.x a multiple of 32); `scratch`
// holds 32 ints of shared memory. Two barriers.
__device__ __forceinline__ int block_prefix_count(bool flag, int* scratch, int* total) {
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  if (lane_id() == 0) scratch[threadIdx.x >> 5] = __popc(ballot);
  return warps_before(scratch, total) + __popc(ballot & ((1u << lane_id()) - 1u));
}

// Exclusive prefix sum of `v` over the threads of the block in threadIdx.x order, and the block
// total; same contract as block_prefix_count.
__device__ __forceinline__ int block_prefix_sum(int v, int* scratch, int* total) {
  int incl = v;
  for (int d = 1; d < 32; d <<= 1) {
    const int o = __shfl_up_sync(kFullMask, incl, d);
    if (static_cast<int>(lane_id()) >= d) incl += o;
  }
  if (lane_id() == 31) scratch[threadIdx.x >> 5] = incl;
  return warps_before(scratch, total) + incl - v;
}

}  // namespace redrafter::cuda
