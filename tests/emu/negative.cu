// Negative controls for the emulator: deliberately broken kernels that the shim must catch.
// Not part of the package; compiled only into the emulation test module.
#include "cuda/common.cuh"

namespace negative {
using redrafter::cuda::dynamic_smem;
using redrafter::cuda::launch_kernel;

// Reverses `n` ints through shared memory but forgets the barrier between the write and the read:
// a thread can read its partner's slot before the partner wrote it (garbage).
__global__ void missing_sync_kernel(int32_t* out, int n) {
  int32_t* s = dynamic_smem<int32_t>();
  const int i = threadIdx.x;
  if (i < n) s[i] = i * 7 + 1;
  // __syncthreads();  <- missing
  if (i < n) out[i] = s[n - 1 - i];
}

// The correct version for comparison (unused by the tests but keeps the bug obvious).
__global__ void with_sync_kernel(int32_t* out, int n) {
  int32_t* s = dynamic_smem<int32_t>();
  const int i = threadIdx.x;
  if (i < n) s[i] = i * 7 + 1;
  __syncthreads();
  if (i < n) out[i] = s[n - 1 - i];
}

// Odd and even threads wait at different barriers.
__global__ void divergent_barrier_kernel(int32_t* out, int n) {
  const int i = threadIdx.x;
  if (i % 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  if (i < n) out[i] = i;
}

// Threads past n return early; the others then wait at a barrier for them.
__global__ void exit_before_barrier_kernel(int32_t* out, int n) {
  const int i = threadIdx.x;
  if (i >= n) return;
  __syncthreads();
  out[i] = i;
}

// Half a warp shuffles with a full mask.
__global__ void divergent_shuffle_kernel(int32_t* out, int n) {
  const int i = threadIdx.x;
  int v = i;
  if (i < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  if (i < n) out[i] = v;
}

cudaError_t missing_sync(int32_t* out, int n) {
  return launch_kernel(missing_sync_kernel, dim3(1), dim3(static_cast<unsigned>(n)), n * sizeof(int32_t), nullptr, out, n);
}
cudaError_t divergent_barrier(int32_t* out, int n) {
  return launch_kernel(divergent_barrier_kernel, dim3(1), dim3(static_cast<unsigned>(n)), 0, nullptr, out, n);
}
cudaError_t exit_before_barrier(int32_t* out, int n) {
  return launch_kernel(exit_before_barrier_kernel, dim3(1), dim3(static_cast<unsigned>(n + 32)), 0, nullptr, out, n);
}
cudaError_t divergent_shuffle(int32_t* out, int n) {
  return launch_kernel(divergent_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out, n);
}

}  // namespace negative
