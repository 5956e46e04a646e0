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
