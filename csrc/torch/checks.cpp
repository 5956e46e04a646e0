// Metadata checks (rank, dtype, device, cross-argument shapes; no values read), shared by the CPU
// and CUDA launchers so that both reject the same inputs with the same messages. Value-range
// checks need host reads: the CPU launchers do them (ops_cpu.cpp); the CUDA kernels instead guard
// against out-of-range values on the device (csrc/cuda/kernels.h says how). Also the input
// preparation that the CPU and CUDA launchers share (checks.h).
#include <ATen/ops/empty.h>

#include <cmath>
#include <limits>

#include "torch/checks.h"

namespace redrafter {

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

void check_beam_topk_inputs(const at::Tensor& logits, const at::Tensor& scores, const at::Tensor& tokens,
                            const at::Tensor& state, int64_t step) {
  constexpr const char* op = "beam_topk";
  check_dim(op, "logits", logits, 3, "B, W, V");
  check_float_dtype(op, "logits", logits);
  check_exact(op, "scores", scores, 2, "B, W", at::kFloat, logits);
  check_index(op, "tokens", tokens, 3, "B, W, L", logits);
  check_dim(op, "state", state, 3, "B, W, D");
  check_float_dtype(op, "state", state);
  check_same_device(op, "state", state, logits);
  const int64_t B = logits.size(0), W = logits.size(1), V = logits.size(2);
  TORCH_CHECK_VALUE(W >= 1 && V >= 1, op, ": logits must have W >= 1 and V >= 1, got shape ", logits.sizes());
  TORCH_CHECK_VALUE(V <= std::numeric_limits<int32_t>::max(), op, ": logits has V = ", V,
                    " but token ids must fit in int32");
  TORCH_CHECK_VALUE(scores.size(0) == B && scores.size(1) == W, op, ": scores must have shape (B, W) = (", B,
                    ", ", W, "), got ", scores.sizes());
  TORCH_CHECK_VALUE(tokens.size(0) == B && tokens.size(1) == W, op,
                    ": tokens must have shape (B, W, L) with B=", B, ", W=", W, ", got ", tokens.sizes());
  TORCH_CHECK_VALUE(state.size(0) == B && state.size(1) == W, op, ": state must have shape (B, W, D) with B=", B,
                    ", W=", W, ", got ", state.sizes());
  TORCH_CHECK_VALUE(step >= 1 && step < tokens.size(2), op, ": step must be an int in [1, L) with L=",
                    tokens.size(2), ", got ", step);
}

void check_build_trie_inputs(const at::Tensor& beams) {
  constexpr const char* op = "build_trie";
  check_dim(op, "beams", beams, 3, "B, W, L");
  check_index_dtype(op, "beams", beams);
  TORCH_CHECK_VALUE(beams.size(1) >= 1 && beams.size(2) >= 1, op,
                    ": beams must have W >= 1 and L >= 1, got shape ", beams.sizes());
  TORCH_CHECK_VALUE(1 + beams.size(1) * (beams.size(2) - 1) <= std::numeric_limits<int32_t>::max(), op,
                    ": beams shape ", beams.sizes(), " gives more trie nodes than int32 can number");
}

void check_ngram_lookup_inputs(const at::Tensor& tokens, const at::Tensor& length, int64_t max_n, int64_t m) {
  constexpr const char* op = "ngram_lookup";
  check_dim(op, "tokens", tokens, 2, "B, S");
  check_dim(op, "length", length, 1, "B");
  check_index_dtype(op, "tokens", tokens);
  check_index_dtype(op, "length", length);
  check_same_device(op, "length", length, tokens);
  TORCH_CHECK_VALUE(tokens.size(1) >= 1, op, ": tokens must have S >= 1 columns, got shape ", tokens.sizes());
  TORCH_CHECK_VALUE(tokens.size(1) <= std::numeric_limits<int32_t>::max(), op, ": tokens has S = ", tokens.size(1),
                    " columns, more than int32 can index");
  TORCH_CHECK_VALUE(length.size(0) == tokens.size(0), op, ": length must have shape (B,) = (", tokens.size(0),
                    ",), got ", length.sizes());
  // the Python wrappers' bound (NGRAM_MAX): the kernels keep key and draft lengths in int32
  TORCH_CHECK_VALUE(max_n >= 1 && max_n < 65536, op, ": max_n must be an int in [1, 65536), got ", max_n);
  TORCH_CHECK_VALUE(m >= 1 && m < 65536, op, ": m must be an int in [1, 65536), got ", m);
}

void check_verify_greedy_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node) {
  constexpr const char* op = "verify_greedy";
  check_dim(op, "logits", logits, 3, "B, N, V");
  check_float_dtype(op, "logits", logits);
  check_index(op, "beams", beams, 3, "B, W, L", logits);
  check_index(op, "beam_node", beam_node, 3, "B, W, L", logits);
  const int64_t B = beams.size(0), W = beams.size(1), L = beams.size(2);
  TORCH_CHECK_VALUE(W >= 1 && L >= 1, op, ": beams must have W >= 1 and L >= 1, got shape ", beams.sizes());
  TORCH_CHECK_VALUE(logits.size(0) == B, op, ": logits has batch ", logits.size(0), " but beams has batch ", B);
  TORCH_CHECK_VALUE(logits.size(1) >= 1 + W * (L - 1), op, ": logits must cover N >= 1 + W*(L-1) = ",
                    1 + W * (L - 1), " nodes, got shape ", logits.sizes());
  TORCH_CHECK_VALUE(logits.size(2) >= 1 && logits.size(2) <= std::numeric_limits<int32_t>::max(), op,
                    ": logits must have 1 <= V < 2^31, got shape ", logits.sizes());
  TORCH_CHECK_VALUE(beam_node.sizes() == beams.sizes(), op, ": beam_node must have shape (B, W, L) = ",
                    beams.sizes(), ", got ", beam_node.sizes());
}

void check_verify_sample_inputs(const at::Tensor& logits, const at::Tensor& beams, const at::Tensor& beam_node,
                                const at::Tensor& accept_u, const at::Tensor& sample_u, double temperature,
                                int64_t top_k, double top_p) {
  constexpr const char* op = "verify_sample";
  check_verify_greedy_inputs(logits, beams, beam_node);
  const int64_t B = beams.size(0), W = beams.size(1), L = beams.size(2);
  check_exact(op, "accept_u", accept_u, 3, "B, L-1, W", at::kFloat, logits);
  check_exact(op, "sample_u", sample_u, 1, "B", at::kFloat, logits);
  TORCH_CHECK_VALUE(accept_u.size(0) == B && accept_u.size(1) == L - 1 && accept_u.size(2) == W, op,
                    ": accept_u must have shape (B, L-1, W) = (", B, ", ", L - 1, ", ", W, "), got ",
                    accept_u.sizes());
  TORCH_CHECK_VALUE(sample_u.size(0) == B, op, ": sample_u must have shape (B,) = (", B, ",), got ",
                    sample_u.sizes());
  TORCH_CHECK_VALUE(std::isfinite(temperature) && temperature >= 0.0, op,
                    ": temperature must be a finite float >= 0, got ", temperature);
  TORCH_CHECK_VALUE(top_k >= 0, op, ": top_k must be an int >= 0 (0: no top-k), got ", top_k);
  TORCH_CHECK_VALUE(top_p > 0.0 && top_p <= 1.0, op, ": top_p must be a float in (0, 1] (1: no top-p), got ", top_p);
}

namespace {

// kv_compact and kv_compact_paged: the metadata of cache_len, path_nodes and accept_len (devices
// compared with the cache tensor kv)...
void check_kv_index_inputs(const char* op, const at::Tensor& kv, const at::Tensor& cache_len,
                           const at::Tensor& path_nodes, const at::Tensor& accept_len) {
  check_exact(op, "cache_len", cache_len, 1, "B", at::kInt, kv);
  check_index(op, "path_nodes", path_nodes, 2, "B, L", kv);
  check_index(op, "accept_len", accept_len, 1, "B", kv);
}

// ... and their shapes against the batch B and the row capacity S (s_note says what S is).
void check_kv_index_shapes(const char* op, int64_t B, int64_t S, const char* s_note, const at::Tensor& cache_len,
                           const at::Tensor& path_nodes, const at::Tensor& accept_len) {
  TORCH_CHECK_VALUE(cache_len.size(0) == B, op, ": cache_len must have shape (B,) = (", B, ",), got ",
                    cache_len.sizes());
  TORCH_CHECK_VALUE(accept_len.size(0) == B, op, ": accept_len must have shape (B,) = (", B, ",), got ",
                    accept_len.sizes());
  TORCH_CHECK_VALUE(path_nodes.size(0) == B, op, ": path_nodes must have shape (B, L) with B=", B, ", got ",
                    path_nodes.sizes());
  const int64_t L = path_nodes.size(1);
  TORCH_CHECK_VALUE(L >= 1 && L <= S, op, ": path_nodes length L=", L, " must be in [1, S=", S, "]", s_note);
}

}  // namespace

void check_kv_compact_inputs(const at::Tensor& kv, const at::Tensor& cache_len, const at::Tensor& path_nodes,
                             const at::Tensor& accept_len) {
  constexpr const char* op = "kv_compact";
  check_dim(op, "kv", kv, 6, "n_layers, 2, B, H_kv, S, D");
  check_float_dtype(op, "kv", kv);
  check_kv_index_inputs(op, kv, cache_len, path_nodes, accept_len);
  const int64_t B = kv.size(2), S = kv.size(4);
  TORCH_CHECK_VALUE(kv.size(1) == 2, op, ": kv dim 1 must be 2 (K and V), got shape ", kv.sizes());
  TORCH_CHECK_VALUE(kv.is_contiguous(), op, ": kv must be contiguous (it is updated in place)");
  check_kv_index_shapes(op, B, S, "", cache_len, path_nodes, accept_len);
}

// kv_pages [n_layers, num_blocks, 2, H_kv, block_size, D] (layers stacked so that one launch covers
// them all), block_table [B, max_blocks] int32; a row's logical capacity is max_blocks * block_size.
void check_kv_compact_paged_inputs(const at::Tensor& kv_pages, const at::Tensor& block_table,
                                   const at::Tensor& cache_len, const at::Tensor& path_nodes,
                                   const at::Tensor& accept_len) {
  constexpr const char* op = "kv_compact_paged";
  check_dim(op, "kv_pages", kv_pages, 6, "n_layers, num_blocks, 2, H_kv, block_size, D");
  check_float_dtype(op, "kv_pages", kv_pages);
  check_exact(op, "block_table", block_table, 2, "B, max_blocks", at::kInt, kv_pages);
  check_kv_index_inputs(op, kv_pages, cache_len, path_nodes, accept_len);
  TORCH_CHECK_VALUE(kv_pages.size(2) == 2, op, ": kv_pages dim 2 must be 2 (K and V), got shape ", kv_pages.sizes());
  TORCH_CHECK_VALUE(kv_pages.size(1) >= 1 && kv_pages.size(4) >= 1, op,
                    ": kv_pages must have num_blocks >= 1 and block_size >= 1, got shape ", kv_pages.sizes());
  TORCH_CHECK_VALUE(kv_pages.size(1) <= std::numeric_limits<int32_t>::max(), op, ": kv_pages has ",
                    kv_pages.size(1), " blocks but block ids must fit in int32");
  TORCH_CHECK_VALUE(kv_pages.is_contiguous(), op, ": kv_pages must be contiguous (it is updated in place)");
  const int64_t B = block_table.size(0), S = block_table.size(1) * kv_pages.size(4);
  check_kv_index_shapes(op, B, S, " (S = max_blocks * block_size)", cache_len, path_nodes, accept_len);
}

// ---------------------------------------------------------------------------------------------
// Input preparation

BeamTopkArgs prepare_beam_topk(const at::Tensor& logits_in, const at::Tensor& scores_in, const at::Tensor& tokens_in,
                               const at::Tensor& state_in) {
  BeamTopkArgs a{logits_in.contiguous(), scores_in.contiguous(), tokens_in.contiguous(), state_in.contiguous(),
                 logits_in.size(0), logits_in.size(1), logits_in.size(2), tokens_in.size(2), state_in.size(2)};
  const auto i32 = a.logits.options().dtype(at::kInt);
  a.scores_out = at::empty({a.B, a.W}, a.logits.options().dtype(at::kFloat));
  a.tokens_out = at::empty({a.B, a.W, a.L}, i32);
  a.state_out = at::empty({a.B, a.W, a.D}, a.state.options());
  a.parent_out = at::empty({a.B, a.W}, i32);
  return a;
}

BuildTrieArgs prepare_build_trie(const at::Tensor& beams_in) {
  BuildTrieArgs a;
  a.beams = beams_in.contiguous();
  a.B = beams_in.size(0);
  a.W = beams_in.size(1);
  a.L = beams_in.size(2);
  a.N = 1 + a.W * (a.L - 1);
  const auto i32 = a.beams.options().dtype(at::kInt);
  a.node_token = at::empty({a.B, a.N}, i32);
  a.node_parent = at::empty({a.B, a.N}, i32);
  a.node_depth = at::empty({a.B, a.N}, i32);
  a.beam_node = at::empty({a.B, a.W, a.L}, i32);
  a.num_nodes = at::empty({a.B}, i32);
  return a;
}

NgramLookupArgs prepare_ngram_lookup(const at::Tensor& tokens_in, const at::Tensor& length_in, int64_t m) {
  NgramLookupArgs a;
  a.idx = common_index_type(tokens_in, length_in);
  a.tokens = tokens_in.to(a.idx).contiguous();
  a.length = length_in.to(a.idx).contiguous();
  a.B = tokens_in.size(0);
  a.S = tokens_in.size(1);
  a.drafts = at::empty({a.B, m}, a.tokens.options().dtype(at::kInt));
  return a;
}

VerifyArgs prepare_verify(const at::Tensor& logits_in, const at::Tensor& beams_in, const at::Tensor& beam_node_in) {
  VerifyArgs v;
  v.logits = logits_in.contiguous();
  v.idx = common_index_type(beams_in, beam_node_in);
  v.beams = beams_in.to(v.idx).contiguous();
  v.beam_node = beam_node_in.to(v.idx).contiguous();
  v.B = beams_in.size(0);
  v.W = beams_in.size(1);
  v.L = beams_in.size(2);
  v.n_logit_rows = logits_in.size(1);
  v.V = logits_in.size(2);
  const auto i32 = v.logits.options().dtype(at::kInt);
  v.accept_len = at::empty({v.B}, i32);
  v.best_beam = at::empty({v.B}, i32);
  v.path_nodes = at::empty({v.B, v.L}, i32);
  v.next_token = at::empty({v.B}, i32);
  return v;
}

KvCompactArgs prepare_kv_compact(const at::Tensor& cache_len, const at::Tensor& path_nodes,
                                 const at::Tensor& accept_len) {
  const auto idx = common_index_type(path_nodes, accept_len);
  return {path_nodes.to(idx).contiguous(), accept_len.to(idx).contiguous(), cache_len.contiguous(), idx};
}

}  // namespace redrafter
