// MLX side of the ReDrafter ops: one Primitive per op. The op functions build the lazy graph node
// (inputs made row-contiguous, shapes and dtypes checked: std::invalid_argument naming the
// argument); eval_cpu runs the shared torch-free CPU kernels of csrc/cpu/ as a task on the
// stream's CPU command encoder; eval_gpu calls the Metal dispatch (csrc/metal/dispatch.h) when the
// module is built with Metal, else throws. Integer inputs must be int32 (redrafter_ext.mlx.ops
// casts). Values cannot be checked before evaluation, so eval_cpu clamps or ignores out-of-range
// values instead of raising: nothing is ever read or written out of bounds (docs/mlx_native.md).
// (Named so that no csrc/mlx header shadows one of MLX's "mlx/*.h" headers on the include path.)
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "mlx/array.h"
#include "mlx/primitives.h"
#include "mlx/utils.h"

namespace redrafter::mlx_ext {
namespace mx = ::mlx::core;

// ---- ops (shapes as in redrafter_ext.reference; all integer outputs int32) ----

// logits [B,W,V] f32/f16/bf16, scores [B,W] f32, tokens [B,W,L] i32, state [B,W,D] float, 1 <= step < L
// -> scores [B,W] f32, tokens [B,W,L] i32, state [B,W,D], parent [B,W] i32
std::vector<mx::array> beam_topk(const mx::array& logits, const mx::array& scores, const mx::array& tokens,
                                 const mx::array& state, int step, mx::StreamOrDevice s = {});
// beams [B,W,L] i32 -> node_token, node_parent, node_depth [B,N], beam_node [B,W,L], num_nodes [B]
std::vector<mx::array> build_trie(const mx::array& beams, mx::StreamOrDevice s = {});
// tokens [B,S] i32, length [B] i32, 1 <= max_n, m < 65536 -> drafts [B,m] i32 (prompt lookup)
mx::array ngram_lookup(const mx::array& tokens, const mx::array& length, int max_n, int m,
                       mx::StreamOrDevice s = {});
// node_parent [B,N] i32, num_nodes [B] i32 -> bool [B,N,N], or int32 words [B,N,ceil(N/32)] when packed
mx::array tree_mask(const mx::array& node_parent, const mx::array& num_nodes, bool packed,
                    mx::StreamOrDevice s = {});
// logits [B,N',V], beams [B,W,L] i32, beam_node [B,W,L] i32 -> accept_len, best_beam [B], path_nodes [B,L],
// next_token [B]
std::vector<mx::array> verify_greedy(const mx::array& logits, const mx::array& beams, const mx::array& beam_node,
                                     mx::StreamOrDevice s = {});
// as verify_greedy plus accept_u [B,L-1,W] f32, sample_u [B] f32; temperature 0 is verify_greedy
std::vector<mx::array> verify_sample(const mx::array& logits, const mx::array& beams, const mx::array& beam_node,
                                     const mx::array& accept_u, const mx::array& sample_u, double temperature,
                                     int top_k, double top_p, mx::StreamOrDevice s = {});
// kv [n_layers,2,B,H,S,D] float, cache_len [B] i32, path_nodes [B,L] i32, accept_len [B] i32
// -> kv, cache_len (new arrays that reuse the inputs' buffers when they are donated)
std::vector<mx::array> kv_compact(const mx::array& kv, const mx::array& cache_len, const mx::array& path_nodes,
                                  const mx::array& accept_len, mx::StreamOrDevice s = {});

// ---- primitives ----

// Common part: no autodiff or vmap (index-valued ops; the batch axis is already explicit).
class Op : public mx::Primitive {
 public:
  explicit Op(mx::Stream stream) : mx::Primitive(stream) {}
  std::vector<mx::array> jvp(const std::vector<mx::array>& primals, const std::vector<mx::array>& tangents,
                             const std::vector<int>& argnums) override;
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>& outputs) override;
  std::pair<std::vector<mx::array>, std::vector<int>> vmap(const std::vector<mx::array>& inputs,
                                                           const std::vector<int>& axes) override;
};

#define REDRAFTER_MLX_PRIMITIVE_COMMON(NAME)                                                    \
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override; \
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override; \
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override;           \
  const char* name() const override { return NAME; }

class BeamTopk : public Op {
 public:
  BeamTopk(mx::Stream s, int step) : Op(s), step_(step) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("BeamTopk")
  bool is_equivalent(const mx::Primitive& other) const override {
    return step_ == static_cast<const BeamTopk&>(other).step_;
  }

 private:
  int step_;
};

class BuildTrie : public Op {
 public:
  explicit BuildTrie(mx::Stream s) : Op(s) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("BuildTrie")
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

class NgramLookup : public Op {
 public:
  NgramLookup(mx::Stream s, int max_n, int m) : Op(s), max_n_(max_n), m_(m) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("NgramLookup")
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const NgramLookup&>(other);
    return max_n_ == o.max_n_ && m_ == o.m_;
  }

 private:
  int max_n_, m_;
};

class TreeMask : public Op {
 public:
  TreeMask(mx::Stream s, bool packed) : Op(s), packed_(packed) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("TreeMask")
  bool is_equivalent(const mx::Primitive& other) const override {
    return packed_ == static_cast<const TreeMask&>(other).packed_;
  }

 private:
  bool packed_;
};

class VerifyGreedy : public Op {
 public:
  explicit VerifyGreedy(mx::Stream s) : Op(s) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("VerifyGreedy")
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

class VerifySample : public Op {
 public:
  VerifySample(mx::Stream s, double temperature, int top_k, double top_p)
      : Op(s), temperature_(temperature), top_k_(top_k), top_p_(top_p) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("VerifySample")
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const VerifySample&>(other);
    return temperature_ == o.temperature_ && top_k_ == o.top_k_ && top_p_ == o.top_p_;
  }

 private:
  double temperature_;
  int top_k_;
  double top_p_;
};

class KvCompact : public Op {
 public:
  explicit KvCompact(mx::Stream s) : Op(s) {}
  REDRAFTER_MLX_PRIMITIVE_COMMON("KvCompact")
  bool is_equivalent(const mx::Primitive&) const override { return true; }
};

#undef REDRAFTER_MLX_PRIMITIVE_COMMON

}  // namespace redrafter::mlx_ext
