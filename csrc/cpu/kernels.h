// Torch-free CPU kernels (raw pointers). Each processes rows [row_begin, row_end) so that the
// launcher can split rows across threads; inputs are assumed validated by the launcher.
#pragma once
#include <cstdint>

namespace redrafter::cpu {

// Ancestor-or-self mask of a trie. node_parent [B, N] (-1: root/padding, parent < child),
// num_nodes [B]. Bool layout: mask [B, N, N]. Packed: words [B, N, ceil(N/32)], LSB first.
template <typename I>
void tree_mask_bool(const I* node_parent, const I* num_nodes, int64_t N, bool* mask, int64_t row_begin,
                    int64_t row_end);
template <typename I>
void tree_mask_packed(const I* node_parent, const I* num_nodes, int64_t N, int32_t* words,
                      int64_t row_begin, int64_t row_end);

// beam_topk, phase 1. Rows r = b*W + w of logits [B*W, V] (T = float or cpu/types.h's Half,
// BFloat16), scores [B*W]. Writes each row's min(W, V) best candidates, sorted by (value desc,
// index asc), to cand_score/cand_token [B*W, beam_topk_stride(W)] (the slots past W are working
// space) and the count to cand_count.
inline int64_t beam_topk_stride(int64_t W) { return W + 8; }
template <typename T>
void beam_topk_rows(const T* logits, const float* scores, int64_t W, int64_t V, float* cand_score,
                    int32_t* cand_token, int32_t* cand_count, int64_t row_begin, int64_t row_end);
// beam_topk, phase 2, batch rows [b_begin, b_end): merge the W candidate lists of a batch row, then
// scores_out [B, W], parent_out [B, W], tokens_out [B, W, L] (the parent's row of tokens [B, W, L],
// position `step` replaced) and state_out (state_row_bytes per beam, copied from the parent).
// heads: [B, W] working space.
template <typename I>
void beam_topk_merge(const float* cand_score, const int32_t* cand_token, const int32_t* cand_count,
                     const I* tokens, const uint8_t* state, int64_t W, int64_t V, int64_t L, int64_t step,
                     int64_t state_row_bytes, float* scores_out, int32_t* tokens_out, uint8_t* state_out,
                     int32_t* parent_out, int32_t* heads, int64_t b_begin, int64_t b_end);

// Trie of beams [B, W, L] (ids in [0, 2^31)): node_token/node_parent/node_depth [B, N],
// N = 1 + W*(L-1), beam_node [B, W, L], num_nodes [B]; batch rows [row_begin, row_end).
template <typename I>
void build_trie(const I* beams, int64_t W, int64_t L, int32_t* node_token, int32_t* node_parent,
                int32_t* node_depth, int32_t* beam_node, int32_t* num_nodes, int64_t row_begin,
                int64_t row_end);

// Prompt-lookup drafts (reference.ngram_lookup): for each batch row b in [row_begin, row_end) of
// tokens [B, S] with length[b] in [0, S], the m tokens after the latest earlier occurrence of the
// longest key (at most max_n of the row's last tokens), repeated with the match's period past the
// row's end; -1s where no key of length >= 1 occurred. drafts: [B, m].
template <typename I>
void ngram_lookup(const I* tokens, const I* length, int64_t S, int64_t max_n, int64_t m, int32_t* drafts,
                  int64_t row_begin, int64_t row_end);

// Greedy verification of beams [B, W, L] against logits [B, n_logit_rows, V] (beam_node values in
// [0, n_logit_rows)). target: [B, n_logit_rows] working space (argmax cache). Outputs accept_len,
// best_beam, next_token [B] and path_nodes [B, L]; batch rows [row_begin, row_end).
template <typename T, typename I>
void verify_greedy(const T* logits, int64_t n_logit_rows, int64_t V, const I* beams, const I* beam_node,
                   int64_t W, int64_t L, int32_t* target, int32_t* accept_len, int32_t* best_beam,
                   int32_t* path_nodes, int32_t* next_token, int64_t row_begin, int64_t row_end);

// Exact sampling (recursive rejection over the trie) of beams [B, W, L] against logits
// [B, n_logit_rows, V]: accept_u [B, L-1, W] and sample_u [B] uniforms in [0, 1), temperature > 0,
// top_k (0: off), top_p in (0, 1]. Draft tokens (positions >= 1) in [0, V), beam_node values in
// [0, n_logit_rows). Outputs as verify_greedy; batch rows [row_begin, row_end).
template <typename T, typename I>
void verify_sample(const T* logits, int64_t n_logit_rows, int64_t V, const I* beams, const I* beam_node, int64_t W,
                   int64_t L, const float* accept_u, const float* sample_u, double temperature, int64_t top_k,
                   double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes, int32_t* next_token,
                   int64_t row_begin, int64_t row_end);

// The kv_compact row rule, one definition for the C++ hosts (the torch CPU launchers raise on a
// violation, the MLX CPU primitive leaves the row untouched): accept_len a in [-1, L-1], cache_len
// c in [0, S], and at every accepted position i <= a, path[i] >= i and c + path[i] < S (path: the
// row's path_nodes). Returns the first violation (kind kNone when the row is valid).
struct KvRowFault {
  enum Kind { kNone, kAcceptLen, kCacheLen, kPathBefore, kPathPast } kind = kNone;
  int64_t i = 0, p = 0;  // the position and its path node, for the path faults
};
template <typename I>
inline KvRowFault kv_row_fault(int64_t a, int64_t c, const I* path, int64_t L, int64_t S) {
  if (a < -1 || a > L - 1) return {KvRowFault::kAcceptLen};
  if (c < 0 || c > S) return {KvRowFault::kCacheLen};
  for (int64_t i = 0; i <= a; ++i) {
    const int64_t p = static_cast<int64_t>(path[i]);
    if (p < i) return {KvRowFault::kPathBefore, i, p};
    if (c + p >= S) return {KvRowFault::kPathPast, i, p};
  }
  return {};
}

// KV compaction in place on kv [n_layers*2, B, H, S, slot_bytes] (bytes): units
// u = (layer*2 + k)*B*H + b*H + h in [unit_begin, unit_end). Inputs validated: accept_len in
// [-1, L-1]; for i <= accept_len[b], i <= path_nodes[b, i] and cache_len[b] + path_nodes[b, i] < S.
template <typename I>
void kv_compact(uint8_t* kv, int64_t B, int64_t H, int64_t S, int64_t slot_bytes, const int32_t* cache_len,
                const I* path_nodes, int64_t L, const I* accept_len, int64_t unit_begin, int64_t unit_end);
// then cache_len[b] += accept_len[b] + 1 for the active rows (accept_len >= 0).
template <typename I>
void kv_compact_advance(int32_t* cache_len, const I* accept_len, int64_t B);

// Paged KV compaction in place on pages [n_layers, num_blocks, 2, H, block_size, slot_bytes] (bytes)
// with block_table [B, max_blocks] int32: logical slot s of row b is physical block
// block_table[b, s / block_size], offset s % block_size. Units u = (layer*2 + k)*B*H + b*H + h in
// [unit_begin, unit_end). Inputs validated as for kv_compact with S = max_blocks * block_size, plus:
// the blocks of every slot read or written hold ids in [0, num_blocks), and no physical block is
// reached from two different (row, logical block) pairs. cache_len is advanced by kv_compact_advance.
template <typename I>
void kv_compact_paged(uint8_t* pages, int64_t num_blocks, int64_t B, int64_t H, int64_t block_size,
                      int64_t slot_bytes, const int32_t* block_table, int64_t max_blocks, const int32_t* cache_len,
                      const I* path_nodes, int64_t L, const I* accept_len, int64_t unit_begin, int64_t unit_end);

// skinny_linear: y [M, N] = x [M, K] @ W^T (+ bias [N]) for few rows M, all float32 and contiguous,
// over W [N, K] packed as [ceil(N/4), ceil(K/16), 4, 16] (zero-padded: packed[t, j, r, i] =
// W[4t + r, 16j + i]). Output tiles (rows 4t..4t+3 of W) [tile_begin, tile_end); bias may be null.
// Each y[m, n] is computed in one fixed order, independent of M and of the tile range.
constexpr int64_t kSkinnyTileRows = 4;
constexpr int64_t kSkinnyTileDepth = 16;
void skinny_linear(const float* x, int64_t M, int64_t K, const float* packed, const float* bias, int64_t N,
                   float* y, int64_t tile_begin, int64_t tile_end);

}  // namespace redrafter::cpu
