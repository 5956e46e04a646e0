// CUDA launcher of kv_compact_paged. Like ops_cuda.cpp it includes no CUDA torch headers (stream and
// device guard from torch's C shim) and reads no values on the host: metadata is checked as on the
// CPU (torch/checks.h), values are guarded by the kernel (csrc/cuda/kernels.h). The guard and
// stream helpers are repeated here (ops_cuda.cpp keeps its own in an anonymous namespace) so this
// file stands alone.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/library.h>

#include "cuda/kernels.h"
#include "torch/checks.h"

namespace redrafter {
namespace {

class PagedDeviceGuard {
 public:
  explicit PagedDeviceGuard(const at::Tensor& t) {
    TORCH_CHECK(aoti_torch_create_device_guard(t.get_device(), &guard_) == AOTI_TORCH_SUCCESS,
                "redrafter: could not set the CUDA device");
  }
  ~PagedDeviceGuard() { aoti_torch_delete_device_guard(guard_); }
  PagedDeviceGuard(const PagedDeviceGuard&) = delete;
  PagedDeviceGuard& operator=(const PagedDeviceGuard&) = delete;

 private:
  DeviceGuardHandle guard_ = nullptr;
};

cudaStream_t paged_current_stream(const at::Tensor& t) {
  StreamHandle handle = nullptr;
  void* native = nullptr;
  TORCH_CHECK(aoti_torch_get_current_stream(t.get_device(), &handle) == AOTI_TORCH_SUCCESS,
              "redrafter: could not get the current CUDA stream");
  const bool ok = torch_stream_native_handle(handle, &native) == AOTI_TORCH_SUCCESS;
  aoti_torch_delete_stream(handle);
  TORCH_CHECK(ok, "redrafter: could not get the native CUDA stream handle");
  return static_cast<cudaStream_t>(native);
}

void kv_compact_paged_cuda(const at::Tensor& kv_pages, const at::Tensor& block_table_in, const at::Tensor& cache_len,
                           const at::Tensor& path_nodes_in, const at::Tensor& accept_len_in) {
  constexpr const char* op = "kv_compact_paged";
  check_kv_compact_paged_inputs(kv_pages, block_table_in, cache_len, path_nodes_in, accept_len_in);
  TORCH_CHECK_VALUE(kv_pages.is_cuda(), op, ": kv_pages must be a CUDA tensor for the CUDA kernel");
  PagedDeviceGuard guard(kv_pages);
  // int64 when either input is: widening never changes a value, so the kernel's guards see the
  // caller's values
  const auto idx =
      path_nodes_in.scalar_type() == at::kLong || accept_len_in.scalar_type() == at::kLong ? at::kLong : at::kInt;
  const at::Tensor path_nodes = path_nodes_in.to(idx).contiguous();
  const at::Tensor accept_len = accept_len_in.to(idx).contiguous();
  const at::Tensor block_table = block_table_in.contiguous();
  const at::Tensor lens = cache_len.contiguous();  // cache_len itself when contiguous
  const cudaError_t e = cuda::kv_compact_paged(
      kv_pages.numel() > 0 ? kv_pages.mutable_data_ptr() : nullptr, kv_pages.size(0), kv_pages.size(1),
      kv_pages.size(3), kv_pages.size(4), kv_pages.size(5) * static_cast<int64_t>(kv_pages.element_size()),
      block_table.const_data_ptr<int32_t>(), block_table.size(0), block_table.size(1), lens.mutable_data_ptr<int32_t>(),
      path_nodes.const_data_ptr(), accept_len.const_data_ptr(),
      idx == at::kLong ? cuda::IndexType::kInt64 : cuda::IndexType::kInt32, path_nodes.size(1),
      paged_current_stream(kv_pages));
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
  if (!lens.is_same(cache_len)) cache_len.copy_(lens);
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CUDA, m) { m.impl("kv_compact_paged", &kv_compact_paged_cuda); }

}  // namespace redrafter
