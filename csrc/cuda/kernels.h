// Torch-free host entry points of the CUDA kernels: device pointers + stream in, error code out.
// Inputs are contiguous. Metadata (shapes, dtypes) is validated by the launcher; values are not
// read on the host (that would synchronise), so every kernel guards against out-of-range values
// itself: it never reads or writes out of bounds, and what it does with such values is stated
// below. The same files compile with g++ against tests/shim/cuda_shim.h (REDRAFTER_EMULATE).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/types.h"

namespace redrafter::cuda {

// node_parent [B, N] int32, num_nodes [B] int32 -> bool mask [B, N, N] or packed [B, N, ceil(N/32)].
// A parent that is not a lower node index ends the ancestor walk (as if -1).
cudaError_t tree_mask(const int32_t* node_parent, const int32_t* num_nodes, int64_t B, int64_t N,
                      bool packed, void* out, cudaStream_t stream);
int64_t tree_mask_max_nodes();  // N above this: the launcher refuses (shared memory)

// beam_topk: logits [B, W, V] (logits_type), scores [B, W] f32, tokens [B, W, L] (tokens_type),
// state [B, W, state_row_bytes bytes] -> scores_out [B, W] f32, tokens_out [B, W, L] i32,
// state_out (as state), parent_out [B, W] i32. workspace: beam_topk_workspace_bytes(B, W, V)
// bytes of device memory (16-byte aligned). Token ids are copied as they are (cast to int32).
size_t beam_topk_workspace_bytes(int64_t B, int64_t W, int64_t V);
cudaError_t beam_topk(const void* logits, FloatType logits_type, const float* scores, const void* tokens,
                      IndexType tokens_type, const void* state, int64_t state_row_bytes, int64_t B, int64_t W,
                      int64_t V, int64_t L, int64_t step, float* scores_out, int32_t* tokens_out, void* state_out,
                      int32_t* parent_out, void* workspace, cudaStream_t stream);

// build_trie: beams [B, W, L] (beams_type) -> node_token, node_parent, node_depth [B, N] i32
// (N = 1 + W*(L-1)), beam_node [B, W, L] i32, num_nodes [B] i32. Tokens are compared at full
// width and stored cast to int32. Requires W*L <= build_trie_max_beam_tokens() (shared memory;
// the launcher checks).
cudaError_t build_trie(const void* beams, IndexType beams_type, int64_t B, int64_t W, int64_t L,
                       int32_t* node_token, int32_t* node_parent, int32_t* node_depth, int32_t* beam_node,
                       int32_t* num_nodes, cudaStream_t stream);
int64_t build_trie_max_beam_tokens();

// ngram_lookup: tokens [B, S] and length [B] (index_type) -> drafts [B, m] i32 (reference.ngram_lookup).
// A length outside [0, S] is clamped into it.
cudaError_t ngram_lookup(const void* tokens, const void* length, IndexType index_type, int64_t B, int64_t S,
                         int64_t max_n, int64_t m, int32_t* drafts, cudaStream_t stream);

// verify_greedy: logits [B, n_logit_rows, V] (logits_type), beams and beam_node [B, W, L]
// (index_type) -> accept_len, best_beam, next_token [B], path_nodes [B, L], all i32. A beam_node
// outside [0, n_logit_rows) counts as a node whose argmax is -1: acceptance stops there (and a
// next_token taken there is -1). workspace: verify_greedy_workspace_bytes(...) bytes of device
// memory (8-byte aligned; per-chunk argmax keys and per-beam walk state).
size_t verify_greedy_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, int64_t W, FloatType logits_type);
// For tests and benchmarks: 0 picks the strategy by size (default), 1 forces the per-node argmax,
// 2 the lazy depth-by-depth walk. Not thread safe; the launchers never call it.
void verify_greedy_set_strategy(int strategy);
cudaError_t verify_greedy(const void* logits, FloatType logits_type, int64_t n_logit_rows, int64_t V,
                          const void* beams, const void* beam_node, IndexType index_type, int64_t B, int64_t W,
                          int64_t L, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                          int32_t* next_token, void* workspace, cudaStream_t stream);

// kv_compact, in place: kv [n_layers*2, B, H, S, slot_bytes bytes], cache_len [B] i32,
// path_nodes [B, L] and accept_len [B] (index_type). A row whose values are out of range
// (accept_len outside [-1, L-1], cache_len outside [0, S], path_nodes[i] < i or
// cache_len + path_nodes[i] >= S for some i <= accept_len) is left untouched, cache_len included.
cudaError_t kv_compact(void* kv, int64_t n_layers, int64_t B, int64_t H, int64_t S, int64_t slot_bytes,
                       int32_t* cache_len, const void* path_nodes, const void* accept_len, IndexType index_type,
                       int64_t L, cudaStream_t stream);

// kv_compact_paged, in place: kv_pages [n_layers, num_blocks, 2, H, block_size, slot_bytes bytes]
// with block_table [B, max_blocks] i32 (logical slot s of row b: block block_table[b, s / block_size],
// offset s % block_size), cache_len [B] i32, path_nodes [B, L] and accept_len [B] (index_type). As
// kv_compact with S = max_blocks * block_size; a row is also left untouched when a block id of a slot
// it reads or writes is outside [0, num_blocks). Contract not checked here (the CPU op checks it): no
// physical block is reached from two (row, logical block) pairs among the slots a step touches.
cudaError_t kv_compact_paged(void* kv_pages, int64_t n_layers, int64_t num_blocks, int64_t H, int64_t block_size,
                             int64_t slot_bytes, const int32_t* block_table, int64_t B, int64_t max_blocks,
                             int32_t* cache_len, const void* path_nodes, const void* accept_len,
                             IndexType index_type, int64_t L, cudaStream_t stream);

}  // namespace redrafter::cuda

// verify_sample (exact sampling, docs/verify_sample_cuda_notes.md): logits [B, n_logit_rows, V]
// (logits_type), beams and beam_node [B, W, L] (index_type), accept_u [B, L-1, W] f32, sample_u [B]
// f32 -> accept_len, best_beam, next_token [B], path_nodes [B, L], all i32. temperature == 0 runs
// verify_greedy (the uniforms are not read). workspace: verify_sample_workspace_bytes(B,
// n_logit_rows, V, W, logits_type, temperature) bytes of device memory (8-byte aligned). Out-of-range values: a child node outside
// [0, n_logit_rows) or a draft token outside [0, V) is rejected; a root node outside the logits stops
// the row at once with next_token -1; uniforms are used as they are (a NaN rejects, an
// out-of-range one biases but never indexes: the sampled token is always a positive-weight index, or
// 0 when no weight is positive).
namespace redrafter::cuda {
size_t verify_sample_workspace_bytes(int64_t B, int64_t n_logit_rows, int64_t V, int64_t W, FloatType logits_type,
                                     double temperature);
// For tests and benchmarks: verify_sample's one-pass filter keeps `slots` candidates per thread
// (-1: the default, 0: never run it, always the general multi-pass path); and the visited filtered
// nodes that took the general path since the last call (the emulator counts them; -1 under nvcc).
// Not thread safe; the launchers never call them.
void verify_sample_set_list_slots(int slots);
int64_t verify_sample_general_nodes();
cudaError_t verify_sample(const void* logits, FloatType logits_type, int64_t n_logit_rows, int64_t V,
                          const void* beams, const void* beam_node, IndexType index_type, int64_t B, int64_t W,
                          int64_t L, const float* accept_u, const float* sample_u, double temperature, int64_t top_k,
                          double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes,
                          int32_t* next_token, void* workspace, cudaStream_t stream);
}  // namespace redrafter::cuda
