// Every op schema of the `redrafter` namespace, in one greppable place. Arguments an op writes
// are marked mutable (Tensor(a!)). The kernels of each device: REDRAFTER_IMPL_ALL (registration.h).
#include <torch/library.h>

TORCH_LIBRARY(redrafter, m) {
  m.def("tree_mask(Tensor node_parent, Tensor num_nodes, bool packed=False) -> Tensor");
  m.def("beam_topk(Tensor logits, Tensor scores, Tensor tokens, Tensor state, int step) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def("build_trie(Tensor beams) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // prompt lookup: drafts [B, m] int32 from each row's history tokens [B, S] up to length [B]
  m.def("ngram_lookup(Tensor tokens, Tensor length, int max_n, int m) -> Tensor");
  m.def("verify_greedy(Tensor logits, Tensor beams, Tensor beam_node) -> (Tensor, Tensor, Tensor, Tensor)");
  // exact sampling: uniforms come in as tensors (accept_u [B, L-1, W], sample_u [B], float32)
  m.def(
      "verify_sample(Tensor logits, Tensor beams, Tensor beam_node, Tensor accept_u, Tensor sample_u, "
      "float temperature, int top_k=0, float top_p=1.0) -> (Tensor, Tensor, Tensor, Tensor)");
  // in place: kv and cache_len are written
  m.def("kv_compact(Tensor(a!) kv, Tensor(b!) cache_len, Tensor path_nodes, Tensor accept_len) -> ()");
  // paged variant: kv_pages [n_layers, num_blocks, 2, H_kv, block_size, D], block_table [B, max_blocks] int32
  m.def(
      "kv_compact_paged(Tensor(a!) kv_pages, Tensor block_table, Tensor(b!) cache_len, Tensor path_nodes, "
      "Tensor accept_len) -> ()");
  // y [M, N] = x [M, K] @ W^T (+ bias) over W packed as [ceil(N/4), ceil(K/16), 4, 16]; CPU only
  m.def("skinny_linear(Tensor x, Tensor packed, int out_features, Tensor? bias=None) -> Tensor");
}
