// Helpers of the CUDA launchers (ops_cuda.cpp, paged_cuda.cpp). They include no CUDA torch
// headers: the current stream and the device guard come from torch's C shim (resolved at run time
// from whichever libtorch is loaded), so the module builds against a CPU torch and still runs on
// the caller's device and stream under a CUDA torch.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>

#include "cuda/types.h"

namespace redrafter {

// Makes t's device current for the scope (device-generic guard of torch's C shim).
class DeviceGuard {
 public:
  explicit DeviceGuard(const at::Tensor& t) {
    TORCH_CHECK(aoti_torch_create_device_guard(t.get_device(), &guard_) == AOTI_TORCH_SUCCESS,
                "redrafter: could not set the CUDA device");
  }
  ~DeviceGuard() { aoti_torch_delete_device_guard(guard_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  DeviceGuardHandle guard_ = nullptr;
};

inline cudaStream_t current_stream(const at::Tensor& t) {
  StreamHandle handle = nullptr;
  void* native = nullptr;
  TORCH_CHECK(aoti_torch_get_current_stream(t.get_device(), &handle) == AOTI_TORCH_SUCCESS,
              "redrafter: could not get the current CUDA stream");
  const bool ok = torch_stream_native_handle(handle, &native) == AOTI_TORCH_SUCCESS;
  aoti_torch_delete_stream(handle);
  TORCH_CHECK(ok, "redrafter: could not get the native CUDA stream handle");
  return static_cast<cudaStream_t>(native);
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
