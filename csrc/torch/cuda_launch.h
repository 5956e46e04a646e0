// Helpers of the CUDA launchers (ops_cuda.cpp). They include no CUDA torch
// headers: the device guard and the current stream go through c10's device-generic guard interface
// (libc10, implemented at run time by whichever CUDA torch is loaded), so the module builds against
// a CPU torch and still runs on the caller's device and stream under a CUDA torch. That interface
// (VirtualGuardImpl::getStream, Stream::native_handle) exists in every torch we support (>= 2.11),
// unlike the stable C shim's torch_stream_native_handle (>= 2.13).
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include "cuda/types.h"

namespace redrafter {

// Makes t's device current for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(const at::Tensor& t) : guard_(t.device()) {}

 private:
  c10::DeviceGuard guard_;
};

// The caller's current stream on t's device (what torch launches its own kernels on, including
// under CUDA-graph capture).
inline cudaStream_t current_stream(const at::Tensor& t) {
  const c10::impl::VirtualGuardImpl impl(t.device().type());
  return static_cast<cudaStream_t>(impl.getStream(t.device()).native_handle());
}

inline void check_cuda(cudaError_t e, const char* op) {
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
}

inline void check_on_cuda(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_cuda(), op, ": ", name, " must be a CUDA tensor for the CUDA kernel");
}

inline cuda::FloatType float_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return cuda::FloatType::kFloat16;
    case at::kBFloat16:
      return cuda::FloatType::kBFloat16;
    default:
      return cuda::FloatType::kFloat32;  // the checks admit only these three
  }
}

inline cuda::IndexType index_type(at::ScalarType t) {
  return t == at::kLong ? cuda::IndexType::kInt64 : cuda::IndexType::kInt32;
}

}  // namespace redrafter
