// Helpers shared by every .cu kernel. Kernels take dynamic shared memory only through
// dynamic_smem<T>() and are launched only through launch_kernel(), so that the host-emulation
// shim can replace both and run the same file on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace redrafter::cuda {

template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char redrafter_smem[];
  return reinterpret_cast<T*>(redrafter_smem);
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

}  // namespace redrafter::cuda
