// CUDA launchers. They include no CUDA torch headers: the current stream comes from torch's C shim
// (resolved at run time from whichever libtorch is loaded), so the module builds against a CPU
// torch and still runs on the caller's stream under a CUDA torch.
#include <ATen/ops/empty.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/library.h>

#include "cuda/kernels.h"
#include "torch/checks.h"

namespace redrafter {

void check_tree_mask_inputs(const at::Tensor& node_parent, const at::Tensor& num_nodes);

namespace {

cudaStream_t current_stream(const at::Tensor& t) {
  StreamHandle handle = nullptr;
  void* native = nullptr;
  TORCH_CHECK(aoti_torch_get_current_stream(t.get_device(), &handle) == AOTI_TORCH_SUCCESS,
              "redrafter: could not get the current CUDA stream");
  const bool ok = torch_stream_native_handle(handle, &native) == AOTI_TORCH_SUCCESS;
  aoti_torch_delete_stream(handle);
  TORCH_CHECK(ok, "redrafter: could not get the native CUDA stream handle");
  return static_cast<cudaStream_t>(native);
}

void check_cuda(cudaError_t e, const char* op) {
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
}

at::Tensor tree_mask_cuda(const at::Tensor& node_parent_in, const at::Tensor& num_nodes_in, bool packed) {
  check_tree_mask_inputs(node_parent_in, num_nodes_in);
  TORCH_CHECK_VALUE(node_parent_in.is_cuda(), "tree_mask: node_parent must be a CUDA tensor");
  const at::Tensor node_parent = node_parent_in.to(at::kInt).contiguous();
  const at::Tensor num_nodes = num_nodes_in.to(at::kInt).contiguous();
  const int64_t B = node_parent.size(0), N = node_parent.size(1);
  at::Tensor out = packed ? at::empty({B, N, (N + 31) / 32}, node_parent.options().dtype(at::kInt))
                          : at::empty({B, N, N}, node_parent.options().dtype(at::kBool));
  check_cuda(cuda::tree_mask(node_parent.const_data_ptr<int32_t>(), num_nodes.const_data_ptr<int32_t>(), B, N,
                             packed, out.data_ptr(), current_stream(out)),
             "tree_mask");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CUDA, m) { m.impl("tree_mask", &tree_mask_cuda); }

}  // namespace redrafter
