// nanobind module redrafter_ext.mlx._ext: the MLX ops of redrafter_mlx.h. Built in MLX's nanobind
// domain so that mlx.core.array / Stream / Device convert both ways; import mlx.core first (the
// Python wrappers in redrafter_ext.mlx.ops do, and add the user-facing argument checks).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include "redrafter_mlx.h"

namespace nb = nanobind;
using namespace nb::literals;
namespace rd = redrafter::mlx_ext;

NB_MODULE(_ext, m) {
  m.doc() = "ReDrafter ops as MLX primitives (CPU: the project's C++ kernels; GPU: Metal on macOS).";
#ifdef REDRAFTER_MLX_METAL
  m.attr("has_metal") = true;
#else
  m.attr("has_metal") = false;
#endif

  m.def("beam_topk", &rd::beam_topk, "logits"_a, "scores"_a, "tokens"_a, "state"_a, "step"_a, nb::kw_only(),
        "stream"_a = nb::none(), "Fused beam-search step -> [scores, tokens, state, parent].");
  m.def("build_trie", &rd::build_trie, "beams"_a, nb::kw_only(), "stream"_a = nb::none(),
        "Trie of the beams -> [node_token, node_parent, node_depth, beam_node, num_nodes].");
  m.def("ngram_lookup", &rd::ngram_lookup, "tokens"_a, "length"_a, "max_n"_a, "m"_a, nb::kw_only(),
        "stream"_a = nb::none(), "Prompt-lookup drafts [B,m] int32 (-1: no occurrence).");
  m.def("tree_mask", &rd::tree_mask, "node_parent"_a, "num_nodes"_a, "packed"_a = false, nb::kw_only(),
        "stream"_a = nb::none(), "Ancestor-or-self mask: bool [B,N,N], or int32 words [B,N,ceil(N/32)].");
  m.def("verify_greedy", &rd::verify_greedy, "logits"_a, "beams"_a, "beam_node"_a, nb::kw_only(),
        "stream"_a = nb::none(), "Greedy verification -> [accept_len, best_beam, path_nodes, next_token].");
  m.def("verify_sample", &rd::verify_sample, "logits"_a, "beams"_a, "beam_node"_a, "accept_u"_a, "sample_u"_a,
        "temperature"_a, "top_k"_a = 0, "top_p"_a = 1.0, nb::kw_only(), "stream"_a = nb::none(),
        "Exact sampling over the trie -> [accept_len, best_beam, path_nodes, next_token].");
  m.def("kv_compact", &rd::kv_compact, "kv"_a, "cache_len"_a, "path_nodes"_a, "accept_len"_a, nb::kw_only(),
        "stream"_a = nb::none(), "KV compaction -> [kv, cache_len] (donated buffers reused).");
}
