// Host-visible types of the CUDA entry points (kernels.h), shared with the kernels (common.cuh).
#pragma once

namespace redrafter::cuda {

// Storage dtypes of float inputs: float32, IEEE half and bfloat16 (the 16-bit ones read as raw
// bits, so that no cuda_fp16.h / cuda_bf16.h is needed and the emulator compiles the same code).
enum class FloatType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class IndexType : int { kInt32 = 0, kInt64 = 1 };

}  // namespace redrafter::cuda
