// Metal side of the MLX primitives: what each Primitive::eval_gpu (csrc/mlx/primitives.cpp) calls.
// Implemented in csrc/metal/dispatch.cpp with the kernels of csrc/metal/*.metal; both are built on
// macOS only. Inputs arrive in the op's argument order and are row-contiguous, integer inputs int32
// (redrafter_ext.mlx.ops casts). Each function allocates its outputs (kv_compact shares the donated
// kv/cache_len buffers when MLX allows it, else copies first) and encodes its kernels on stream s.
#pragma once
#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace redrafter::metal {
namespace mx = mlx::core;
using Arrays = std::vector<mx::array>;

// in: logits [B,W,V] (f32/f16/bf16), scores [B,W] f32, tokens [B,W,L] i32, state [B,W,D]
// out: scores [B,W] f32, tokens [B,W,L] i32, state [B,W,D], parent [B,W] i32
void beam_topk(const Arrays& in, Arrays& out, int step, mx::Stream s);
// in: beams [B,W,L]; out: node_token, node_parent, node_depth [B,N], beam_node [B,W,L], num_nodes [B]
void build_trie(const Arrays& in, Arrays& out, mx::Stream s);
// in: tokens [B,S] i32, length [B] i32; out: drafts [B,m] i32 (lengths clamped into [0, S])
void ngram_lookup(const Arrays& in, Arrays& out, int max_n, int m, mx::Stream s);
// in: node_parent [B,N], num_nodes [B]; out: mask bool [B,N,N] or int32 words [B,N,ceil(N/32)]
void tree_mask(const Arrays& in, Arrays& out, bool packed, mx::Stream s);
// in: logits [B,R,V], beams [B,W,L], beam_node [B,W,L]; out: accept_len, best_beam [B],
// path_nodes [B,L], next_token [B] (all i32)
void verify_greedy(const Arrays& in, Arrays& out, mx::Stream s);
// in: as verify_greedy plus accept_u [B,L-1,W] f32, sample_u [B] f32; out: as verify_greedy
void verify_sample(const Arrays& in, Arrays& out, float temperature, int top_k, float top_p, mx::Stream s);
// in: kv [n_layers,2,B,H,S,D], cache_len [B] i32, path_nodes [B,L], accept_len [B]
// out: kv (compacted), cache_len (advanced)
void kv_compact(const Arrays& in, Arrays& out, mx::Stream s);

}  // namespace redrafter::metal
