// CUDA launchers. They include no CUDA torch headers (stream and device guard: torch/cuda_launch.h).
// Metadata is validated exactly like the CPU launchers (torch/checks.h). Values are not read on
// the host (that would synchronise and break CUDA graph capture): the kernels guard against
// out-of-range values themselves, as csrc/cuda/kernels.h documents per op.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <tuple>

#include "cuda/kernels.h"
#include "torch/checks.h"
#include "torch/cuda_launch.h"
#include "torch/registration.h"

namespace redrafter {
namespace {

at::Tensor tree_mask_cuda(const at::Tensor& node_parent_in, const at::Tensor& num_nodes_in, bool packed) {
  check_tree_mask_inputs(node_parent_in, num_nodes_in);
  check_on_cuda("tree_mask", "node_parent", node_parent_in);
  TORCH_CHECK_VALUE(node_parent_in.size(1) <= cuda::tree_mask_max_nodes(), "tree_mask: node_parent has ",
                    node_parent_in.size(1), " nodes per row, more than the CUDA kernel's ", cuda::tree_mask_max_nodes());
  DeviceGuard guard(node_parent_in);
  // int32 inside: a parent or count that does not fit is garbage in any case, and the kernel's
  // walk stops at any parent that is not a lower node index
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

Tensors4 beam_topk_cuda(const at::Tensor& logits_in, const at::Tensor& scores_in, const at::Tensor& tokens_in,
                        const at::Tensor& state_in, int64_t step) {
  check_beam_topk_inputs(logits_in, scores_in, tokens_in, state_in, step);
  check_on_cuda("beam_topk", "logits", logits_in);
  DeviceGuard guard(logits_in);
  const BeamTopkArgs a = prepare_beam_topk(logits_in, scores_in, tokens_in, state_in);
  const auto& [logits, scores, tokens, state, B, W, V, L, D, scores_out, tokens_out, state_out, parent_out] = a;
  const auto ws_bytes = static_cast<int64_t>(cuda::beam_topk_workspace_bytes(B, W, V));
  at::Tensor workspace = at::empty({ws_bytes}, logits.options().dtype(at::kByte));  // allocator: 512-byte aligned
  check_cuda(cuda::beam_topk(logits.const_data_ptr(), float_type(logits), scores.const_data_ptr<float>(),
                             tokens.const_data_ptr(), index_type(tokens.scalar_type()), state.const_data_ptr(),
                             D * static_cast<int64_t>(state.element_size()), B, W, V, L, step,
                             scores_out.mutable_data_ptr<float>(), tokens_out.mutable_data_ptr<int32_t>(),
                             state_out.mutable_data_ptr(), parent_out.mutable_data_ptr<int32_t>(),
                             workspace.mutable_data_ptr(), current_stream(logits)),
             "beam_topk");
  return a.outputs();
}

Tensors5 build_trie_cuda(const at::Tensor& beams_in) {
  check_build_trie_inputs(beams_in);
  check_on_cuda("build_trie", "beams", beams_in);
  TORCH_CHECK_VALUE(beams_in.size(1) * beams_in.size(2) <= cuda::build_trie_max_beam_tokens(),
                    "build_trie: beams shape ", beams_in.sizes(), " has more than ", cuda::build_trie_max_beam_tokens(),
                    " tokens (W*L) per row (CUDA kernel)");
  DeviceGuard guard(beams_in);
  const BuildTrieArgs a = prepare_build_trie(beams_in);
  const auto& [beams, B, W, L, N, node_token, node_parent, node_depth, beam_node, num_nodes] = a;
  check_cuda(cuda::build_trie(beams.const_data_ptr(), index_type(beams.scalar_type()), B, W, L,
                              node_token.mutable_data_ptr<int32_t>(), node_parent.mutable_data_ptr<int32_t>(),
                              node_depth.mutable_data_ptr<int32_t>(), beam_node.mutable_data_ptr<int32_t>(),
                              num_nodes.mutable_data_ptr<int32_t>(), current_stream(beams)),
             "build_trie");
  return a.outputs();
}

// ngram_lookup: metadata checks only (reading length on the host would synchronise); the kernel
// clamps a length outside [0, S] into it.
at::Tensor ngram_lookup_cuda(const at::Tensor& tokens_in, const at::Tensor& length_in, int64_t max_n, int64_t m) {
  check_ngram_lookup_inputs(tokens_in, length_in, max_n, m);
  check_on_cuda("ngram_lookup", "tokens", tokens_in);
  DeviceGuard guard(tokens_in);
  const NgramLookupArgs a = prepare_ngram_lookup(tokens_in, length_in, m);
  check_cuda(cuda::ngram_lookup(a.tokens.const_data_ptr(), a.length.const_data_ptr(), index_type(a.idx), a.B, a.S,
                                max_n, m, a.drafts.mutable_data_ptr<int32_t>(), current_stream(a.tokens)),
             "ngram_lookup");
  return a.drafts;
}

Tensors4 verify_greedy_cuda(const at::Tensor& logits_in, const at::Tensor& beams_in,
                            const at::Tensor& beam_node_in) {
  check_verify_greedy_inputs(logits_in, beams_in, beam_node_in);
  check_on_cuda("verify_greedy", "logits", logits_in);
  DeviceGuard guard(logits_in);
  const VerifyArgs v = prepare_verify(logits_in, beams_in, beam_node_in);
  const auto& [logits, beams, beam_node, idx, B, W, L, n_logit_rows, V, accept_len, best_beam, path_nodes,
                next_token] = v;
  // split argmax keys and the walk's per-beam state
  const auto ws_bytes =
      static_cast<int64_t>(cuda::verify_greedy_workspace_bytes(B, n_logit_rows, V, W, float_type(logits)));
  at::Tensor workspace = at::empty({ws_bytes}, logits.options().dtype(at::kByte));
  check_cuda(cuda::verify_greedy(logits.const_data_ptr(), float_type(logits), n_logit_rows, V, beams.const_data_ptr(),
                                 beam_node.const_data_ptr(), index_type(idx), B, W, L,
                                 accept_len.mutable_data_ptr<int32_t>(), best_beam.mutable_data_ptr<int32_t>(),
                                 path_nodes.mutable_data_ptr<int32_t>(), next_token.mutable_data_ptr<int32_t>(),
                                 workspace.mutable_data_ptr(), current_stream(logits)),
             "verify_greedy");
  return v.outputs();
}

// verify_sample: metadata checks only (no host reads of the uniforms, tokens or node ids, so the
// op stays sync-free and graph-capturable); the kernel guards against out-of-range values itself
// (csrc/cuda/kernels.h). temperature == 0 is verify_greedy, exactly.
Tensors4 verify_sample_cuda(
    const at::Tensor& logits_in, const at::Tensor& beams_in, const at::Tensor& beam_node_in,
    const at::Tensor& accept_u_in, const at::Tensor& sample_u_in, double temperature, int64_t top_k, double top_p) {
  check_verify_sample_inputs(logits_in, beams_in, beam_node_in, accept_u_in, sample_u_in, temperature, top_k, top_p);
  check_on_cuda("verify_sample", "logits", logits_in);
  DeviceGuard guard(logits_in);
  const VerifyArgs v = prepare_verify(logits_in, beams_in, beam_node_in);
  const auto& [logits, beams, beam_node, idx, B, W, L, n_logit_rows, V, accept_len, best_beam, path_nodes,
                next_token] = v;
  const at::Tensor accept_u = accept_u_in.contiguous();
  const at::Tensor sample_u = sample_u_in.contiguous();
  // verify_greedy's workspace when greedy (sampling keeps no per-token state in global memory)
  const auto ws_bytes =
      static_cast<int64_t>(cuda::verify_sample_workspace_bytes(B, n_logit_rows, V, W, float_type(logits), temperature));
  at::Tensor workspace = at::empty({ws_bytes}, logits.options().dtype(at::kByte));
  check_cuda(cuda::verify_sample(logits.const_data_ptr(), float_type(logits), n_logit_rows, V, beams.const_data_ptr(),
                                 beam_node.const_data_ptr(), index_type(idx), B, W, L,
                                 accept_u.const_data_ptr<float>(), sample_u.const_data_ptr<float>(), temperature, top_k,
                                 top_p, accept_len.mutable_data_ptr<int32_t>(), best_beam.mutable_data_ptr<int32_t>(),
                                 path_nodes.mutable_data_ptr<int32_t>(), next_token.mutable_data_ptr<int32_t>(),
                                 workspace.numel() > 0 ? workspace.mutable_data_ptr() : nullptr,
                                 current_stream(logits)),
             "verify_sample");
  return v.outputs();
}

void kv_compact_cuda(const at::Tensor& kv, const at::Tensor& cache_len, const at::Tensor& path_nodes_in,
                     const at::Tensor& accept_len_in) {
  check_kv_compact_inputs(kv, cache_len, path_nodes_in, accept_len_in);
  check_on_cuda("kv_compact", "kv", kv);
  DeviceGuard guard(kv);
  const KvCompactArgs a = prepare_kv_compact(cache_len, path_nodes_in, accept_len_in);
  check_cuda(cuda::kv_compact(kv.numel() > 0 ? kv.mutable_data_ptr() : nullptr, kv.size(0), kv.size(2), kv.size(3),
                              kv.size(4), kv.size(5) * static_cast<int64_t>(kv.element_size()),
                              a.lens.mutable_data_ptr<int32_t>(), a.path_nodes.const_data_ptr(),
                              a.accept_len.const_data_ptr(), index_type(a.idx), a.path_nodes.size(1),
                              current_stream(kv)),
             "kv_compact");
  finish_kv_compact(cache_len, a);
}

// kv_compact_paged: the same, through the block table (block ids guarded by the kernel)
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

TORCH_LIBRARY_IMPL(redrafter, CUDA, m) { REDRAFTER_IMPL_ALL(m, cuda); }

}  // namespace redrafter
