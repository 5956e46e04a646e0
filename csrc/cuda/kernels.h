// Torch-free host entry points of the CUDA kernels: device pointers + stream in, error code out.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace redrafter::cuda {

// node_parent [B, N] int32, num_nodes [B] int32 -> bool mask [B, N, N] or packed [B, N, ceil(N/32)].
cudaError_t tree_mask(const int32_t* node_parent, const int32_t* num_nodes, int64_t B, int64_t N,
                      bool packed, void* out, cudaStream_t stream);

}  // namespace redrafter::cuda
