// Input validation for the torch launchers. Every message starts with the op name and names the
// argument; TORCH_CHECK_VALUE/TYPE surface in Python as ValueError/TypeError. Also the input
// preparation (contiguous copies, output allocation) that the CPU and CUDA launchers share.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>
#include <tuple>

#include "cpu/kernels.h"

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

// An argument of one exact dtype (float32 uniforms and scores, int32 lengths and block ids), on the
// device of `like`, with `ndim` dims.
inline void check_exact(const char* op, const char* name, const at::Tensor& t, int64_t ndim, const char* dims,
                        at::ScalarType dtype, const at::Tensor& like) {
  check_dim(op, name, t, ndim, dims);
  TORCH_CHECK_TYPE(t.scalar_type() == dtype, op, ": ", name, " must have dtype ",
                   dtype == at::kFloat ? "float32" : dtype == at::kInt ? "int32" : c10::toString(dtype),
                   ", got ", t.scalar_type());
  check_same_device(op, name, t, like);
}

// An index argument (int32 or int64) with `ndim` dims on the device of `like`.
inline void check_index(const char* op, const char* name, const at::Tensor& t, int64_t ndim, const char* dims,
                        const at::Tensor& like) {
  check_dim(op, name, t, ndim, dims);
  check_index_dtype(op, name, t);
  check_same_device(op, name, t, like);
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
void check_ngram_lookup_inputs(const at::Tensor& tokens, const at::Tensor& length, int64_t max_n, int64_t m);
void check_verify_greedy_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node);
void check_verify_sample_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node,
                                const at::Tensor& accept_u, const at::Tensor& sample_u, double temperature,
                                int64_t top_k, double top_p);
void check_kv_compact_inputs(const at::Tensor& kv, const at::Tensor& cache_len, const at::Tensor& path_nodes,
                             const at::Tensor& accept_len);

void check_kv_compact_paged_inputs(const at::Tensor& kv_pages, const at::Tensor& block_table,
                                   const at::Tensor& cache_len, const at::Tensor& path_nodes,
                                   const at::Tensor& accept_len);

// The row rule of kv_compact and kv_compact_paged (cpu::kv_row_fault) on row b, raised as a
// ValueError naming the value (the CUDA kernels guard the same rule on the device). `s_is` says
// what S is in messages.
template <typename I>
void check_kv_row(const char* op, int64_t b, int64_t c, const I* path, int64_t L, int64_t a, int64_t S,
                  const char* s_is) {
  using F = cpu::KvRowFault;
  const F f = cpu::kv_row_fault(a, c, path, L, S);
  TORCH_CHECK_VALUE(f.kind != F::kAcceptLen, op, ": accept_len[", b, "] = ", a, " must be in [-1, L-1 = ", L - 1,
                    "] (-1: inactive row)");
  TORCH_CHECK_VALUE(f.kind != F::kCacheLen, op, ": cache_len[", b, "] = ", c, " must be in [0, S = ", S, "] (", s_is,
                    ")");
  TORCH_CHECK_VALUE(f.kind != F::kPathBefore, op, ": path_nodes[", b, ", ", f.i, "] = ", f.p,
                    " must satisfy path_nodes[b, i] >= i (an accepted node is never before its position)");
  TORCH_CHECK_VALUE(f.kind != F::kPathPast, op, ": cache_len[", b, "] + path_nodes[", b, ", ", f.i, "] = ", c, " + ",
                    f.p, " exceeds the row capacity S = ", S, " (", s_is, ")");
}

// ---------------------------------------------------------------------------------------------
// Input preparation shared by the CPU and CUDA launchers (after their checks and device guard).

// One index type for two index inputs: int64 when either is, since widening never changes a value
// (so no value is truncated before the CPU's range checks or the CUDA kernels' guards see it).
inline at::ScalarType common_index_type(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kLong || b.scalar_type() == at::kLong ? at::kLong : at::kInt;
}

// The launchers' multi-output results.
using Tensors4 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using Tensors5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// beam_topk's inputs, contiguous, their sizes, and the four outputs, allocated.
struct BeamTopkArgs {
  at::Tensor logits, scores, tokens, state;
  int64_t B, W, V, L, D;
  at::Tensor scores_out, tokens_out, state_out, parent_out;  // [B, W] f32, [B, W, L] i32, [B, W, D], [B, W] i32
  Tensors4 outputs() const {
    return {scores_out, tokens_out, state_out, parent_out};
  }
};
BeamTopkArgs prepare_beam_topk(const at::Tensor& logits, const at::Tensor& scores, const at::Tensor& tokens,
                               const at::Tensor& state);

// build_trie: beams contiguous, sizes (N = 1 + W*(L-1)), and the five int32 outputs, allocated.
struct BuildTrieArgs {
  at::Tensor beams;
  int64_t B, W, L, N;
  at::Tensor node_token, node_parent, node_depth, beam_node, num_nodes;  // [B, N] x3, [B, W, L], [B]
  Tensors5 outputs() const {
    return {node_token, node_parent, node_depth, beam_node, num_nodes};
  }
};
BuildTrieArgs prepare_build_trie(const at::Tensor& beams);

// ngram_lookup: tokens and length contiguous in their common index type idx, and the int32 output
// drafts [B, m], allocated.
struct NgramLookupArgs {
  at::Tensor tokens, length, drafts;
  at::ScalarType idx;
  int64_t B, S;
};
NgramLookupArgs prepare_ngram_lookup(const at::Tensor& tokens, const at::Tensor& length, int64_t m);

// verify_greedy / verify_sample: logits contiguous, beams and beam_node contiguous in their common
// index type idx, sizes (n_logit_rows = logits.size(1)), and the four int32 outputs, allocated.
struct VerifyArgs {
  at::Tensor logits, beams, beam_node;
  at::ScalarType idx;
  int64_t B, W, L, n_logit_rows, V;
  at::Tensor accept_len, best_beam, path_nodes, next_token;  // [B], [B], [B, L], [B]

  Tensors4 outputs() const {
    return {accept_len, best_beam, path_nodes, next_token};
  }
};
VerifyArgs prepare_verify(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node);

// kv_compact / kv_compact_paged: path_nodes and accept_len contiguous in their common index type,
// cache_len contiguous (cache_len itself when it already is; else finish_kv_compact copies back).
struct KvCompactArgs {
  at::Tensor path_nodes, accept_len, lens;
  at::ScalarType idx;
};
KvCompactArgs prepare_kv_compact(const at::Tensor& cache_len, const at::Tensor& path_nodes,
                                 const at::Tensor& accept_len);
inline void finish_kv_compact(const at::Tensor& cache_len, const KvCompactArgs& args) {
  if (!args.lens.is_same(cache_len)) cache_len.copy_(args.lens);
}

}  // namespace redrafter
