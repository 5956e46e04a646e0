// Input validation for the torch launchers. Every message starts with the op name and names the
// argument; TORCH_CHECK_VALUE/TYPE surface in Python as ValueError/TypeError.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

namespace redrafter {

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t ndim,
                      const char* dims) {
  TORCH_CHECK_VALUE(t.dim() == ndim, op, ": ", name, " must have ", ndim, " dims (", dims,
                    "), got shape ", t.sizes());
}

inline void check_index_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, ": ", name,
                   " must have dtype int32 or int64, got ", t.scalar_type());
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const at::Tensor& ref) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), op, ": ", name, " is on ", t.device(),
                    " but the other inputs are on ", ref.device());
}

inline void check_float_dtype(const char* op, const char* name, const at::Tensor& t) {
  const auto s = t.scalar_type();
  TORCH_CHECK_TYPE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16, op, ": ", name,
                   " must have dtype float32, float16 or bfloat16, got ", s);
}

inline void check_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// Metadata checks (rank, dtype, device, cross-argument shapes; no values read), shared by the CPU
// and CUDA launchers. Defined in checks.cpp.
void check_tree_mask_inputs(const at::Tensor& node_parent, const at::Tensor& num_nodes);
void check_beam_topk_inputs(const at::Tensor& logits, const at::Tensor& scores, const at::Tensor& tokens,
                            const at::Tensor& state, int64_t step);
void check_build_trie_inputs(const at::Tensor& beams);
void check_verify_greedy_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node);
void check_verify_sample_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node,
                                const at::Tensor& accept_u, const at::Tensor& sample_u, double temperature,
                                int64_t top_k, double top_p);
void check_kv_compact_inputs(const at::Tensor& kv, const at::Tensor& cache_len, const at::Tensor& path_nodes,
                             const at::Tensor& accept_len);

void check_kv_compact_paged_inputs(const at::Tensor& kv_pages, const at::Tensor& block_table,
                                   const at::Tensor& cache_len, const at::Tensor& path_nodes,
                                   const at::Tensor& accept_len);

}  // namespace redrafter
