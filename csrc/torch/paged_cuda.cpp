// CUDA launcher of kv_compact_paged. Like ops_cuda.cpp it includes no CUDA torch headers
// (torch/cuda_launch.h) and reads no values on the host: metadata is checked as on the CPU
// (torch/checks.h), values are guarded by the kernel (csrc/cuda/kernels.h).
#include <torch/library.h>

#include "cuda/kernels.h"
#include "torch/checks.h"
#include "torch/cuda_launch.h"

namespace redrafter {
namespace {

void kv_compact_paged_cuda(const at::Tensor& kv_pages, const at::Tensor& block_table_in, const at::Tensor& cache_len,
                           const at::Tensor& path_nodes_in, const at::Tensor& accept_len_in) {
  constexpr const char* op = "kv_compact_paged";
  check_kv_compact_paged_inputs(kv_pages, block_table_in, cache_len, path_nodes_in, accept_len_in);
  check_on_cuda(op, "kv_pages", kv_pages);
  DeviceGuard guard(kv_pages);
  const KvCompactArgs a = prepare_kv_compact(cache_len, path_nodes_in, accept_len_in);
  const at::Tensor block_table = block_table_in.contiguous();
  check_cuda(cuda::kv_compact_paged(
                 kv_pages.numel() > 0 ? kv_pages.mutable_data_ptr() : nullptr, kv_pages.size(0), kv_pages.size(1),
                 kv_pages.size(3), kv_pages.size(4), kv_pages.size(5) * static_cast<int64_t>(kv_pages.element_size()),
                 block_table.const_data_ptr<int32_t>(), block_table.size(0), block_table.size(1),
                 a.lens.mutable_data_ptr<int32_t>(), a.path_nodes.const_data_ptr(), a.accept_len.const_data_ptr(),
                 index_type(a.idx), a.path_nodes.size(1), current_stream(kv_pages)),
             op);
  finish_kv_compact(cache_len, a);
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CUDA, m) { m.impl("kv_compact_paged", &kv_compact_paged_cuda); }

}  // namespace redrafter
