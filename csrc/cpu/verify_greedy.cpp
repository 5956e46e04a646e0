// Greedy verification. Beam w is accepted up to its first draft token that differs from the
// target's argmax at the parent node. The argmax of a node is computed only when a beam reaches it
// (cached per node): since the argmax is unique, every beam still matching at depth d sits on the
// same greedy path, so a row costs about accept_len + 1 argmaxes over V instead of N.
#include <algorithm>
#include <limits>

#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace redrafter::cpu {
namespace {

// torch.argmax: the first maximum; a NaN counts as the maximum (the first NaN wins).
template <typename T>
int32_t argmax_row(const T* row, int64_t V) {
  float buf[vec::kBlock];
  float best = -std::numeric_limits<float>::infinity();
  int64_t best_off = -1;
  for (int64_t off = 0; off < V; off += vec::kBlock) {
    const int64_t n = std::min(vec::kBlock, V - off);
    const float* x = detail::load_block(row, off, n, buf);
    const vec::BlockMax bm = vec::block_max(x, n);
    if (bm.nan) {
      for (int64_t j = 0; j < n; ++j) {
        if (x[j] != x[j]) return static_cast<int32_t>(off + j);
      }
    }
    if (bm.max > best) {  // strict: an equal maximum in a later block loses
      best = bm.max;
      best_off = off;
    }
  }
  if (best_off < 0) return 0;  // every value is -inf
  const int64_t n = std::min(vec::kBlock, V - best_off);
  const float* x = detail::load_block(row, best_off, n, buf);
  for (int64_t j = 0; j < n; ++j) {
    if (x[j] == best) return static_cast<int32_t>(best_off + j);
  }
  return static_cast<int32_t>(best_off);  // unreachable
}

}  // namespace

template <typename T, typename I>
void verify_greedy(const T* logits, int64_t n_logit_rows, int64_t V, const I* beams, const I* beam_node,
                   int64_t W, int64_t L, int32_t* target, int32_t* accept_len, int32_t* best_beam,
                   int32_t* path_nodes, int32_t* next_token, int64_t row_begin, int64_t row_end) {
  for (int64_t b = row_begin; b < row_end; ++b) {
    int32_t* tgt = target + b * n_logit_rows;
    std::fill(tgt, tgt + n_logit_rows, -1);
    const T* rows = logits + b * n_logit_rows * V;
    auto argmax_at = [&](int64_t node) {
      if (tgt[node] < 0) tgt[node] = argmax_row(rows + node * V, V);
      return tgt[node];
    };
    const I* beam = beams + b * W * L;
    const I* bn = beam_node + b * W * L;
    int64_t best = 0, best_len = -1;
    for (int64_t w = 0; w < W && best_len < L - 1; ++w) {  // a later beam cannot beat L-1
      const I* t = beam + w * L;
      const I* nw = bn + w * L;
      int64_t len = 0;
      while (len < L - 1 && static_cast<int64_t>(t[len + 1]) == argmax_at(static_cast<int64_t>(nw[len]))) ++len;
      if (len > best_len) {  // ties: the lowest beam
        best_len = len;
        best = w;
      }
    }
    const I* path = bn + best * L;
    accept_len[b] = static_cast<int32_t>(best_len);
    best_beam[b] = static_cast<int32_t>(best);
    for (int64_t i = 0; i < L; ++i) path_nodes[b * L + i] = i <= best_len ? static_cast<int32_t>(path[i]) : -1;
    next_token[b] = argmax_at(static_cast<int64_t>(path[best_len]));
  }
}

#define RD_VERIFY(T, I)                                                                                  \
  template void verify_greedy<T, I>(const T*, int64_t, int64_t, const I*, const I*, int64_t, int64_t,      \
                                    int32_t*, int32_t*, int32_t*, int32_t*, int32_t*, int64_t, int64_t);
RD_VERIFY(float, int32_t)
RD_VERIFY(float, int64_t)
RD_VERIFY(Half, int32_t)
RD_VERIFY(Half, int64_t)
RD_VERIFY(BFloat16, int32_t)
RD_VERIFY(BFloat16, int64_t)
#undef RD_VERIFY

}  // namespace redrafter::cpu
