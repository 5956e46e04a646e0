// CPU launchers: validate every input (metadata, then values), allocate, split rows over threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "cpu/kernels.h"
#include "torch/checks.h"

namespace redrafter {

// Shared by the CPU and CUDA launchers: shape/dtype/device checks that read no values.
void check_tree_mask_inputs(const at::Tensor& node_parent, const at::Tensor& num_nodes) {
  constexpr const char* op = "tree_mask";
  check_dim(op, "node_parent", node_parent, 2, "B, N");
  check_dim(op, "num_nodes", num_nodes, 1, "B");
  check_index_dtype(op, "node_parent", node_parent);
  check_index_dtype(op, "num_nodes", num_nodes);
  check_same_device(op, "num_nodes", num_nodes, node_parent);
  TORCH_CHECK_VALUE(node_parent.size(1) >= 1, op, ": node_parent must have N >= 1 nodes, got shape ",
                    node_parent.sizes());
  TORCH_CHECK_VALUE(num_nodes.size(0) == node_parent.size(0), op, ": num_nodes must have shape (B,) = (",
                    node_parent.size(0), ",), got ", num_nodes.sizes());
}

namespace {

template <typename I>
void check_tree_values(const I* parent, const I* num_nodes, int64_t B, int64_t N) {
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = static_cast<int64_t>(num_nodes[b]);
    TORCH_CHECK_VALUE(n >= 0 && n <= N, "tree_mask: num_nodes[", b, "] = ", n, " is outside [0, N=", N, "]");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = static_cast<int64_t>(parent[b * N + i]);
      TORCH_CHECK_VALUE(p >= -1 && p < i, "tree_mask: node_parent[", b, ", ", i, "] = ", p,
                        " must be -1 or a lower node index (parents precede children)");
    }
  }
}

at::Tensor tree_mask_cpu(const at::Tensor& node_parent_in, const at::Tensor& num_nodes_in, bool packed) {
  check_tree_mask_inputs(node_parent_in, num_nodes_in);
  TORCH_CHECK_VALUE(node_parent_in.is_cpu(), "tree_mask: node_parent must be a CPU tensor for the CPU kernel");
  // one index type for both inputs keeps a single template instantiation per call
  const auto idx = node_parent_in.scalar_type();
  const at::Tensor node_parent = node_parent_in.contiguous();
  const at::Tensor num_nodes = num_nodes_in.to(idx).contiguous();
  const int64_t B = node_parent.size(0), N = node_parent.size(1);
  at::Tensor out = packed ? at::empty({B, N, (N + 31) / 32}, node_parent.options().dtype(at::kInt))
                          : at::empty({B, N, N}, node_parent.options().dtype(at::kBool));
  AT_DISPATCH_INDEX_TYPES(idx, "tree_mask", [&] {
    const index_t* parent = node_parent.const_data_ptr<index_t>();
    const index_t* nn = num_nodes.const_data_ptr<index_t>();
    check_tree_values(parent, nn, B, N);
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * N));
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      if (packed) {
        cpu::tree_mask_packed(parent, nn, N, out.mutable_data_ptr<int32_t>(), b0, b1);
      } else {
        cpu::tree_mask(parent, nn, N, out.mutable_data_ptr<bool>(), b0, b1);
      }
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CPU, m) { m.impl("tree_mask", &tree_mask_cpu); }

}  // namespace redrafter
