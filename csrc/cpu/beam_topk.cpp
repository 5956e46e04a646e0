// Fused beam-search step: log-softmax + running score + top-W over W*V + reorder by parent.
//
// Phase 1 (beam_topk_rows), one pass per (b, w) row of V logits, block by block: online max and
// sum of exp(x - max) for the log-sum-exp, and the row's top-(W+8) logits by (x desc, index
// asc): values above a running threshold go to a pool that is cut back to the best W+8 with
// nth_element whenever it doubles (a block whose max does not beat the threshold is skipped after
// one compare; inside a block a vector scan collects the values above it). No sort of V.
// The candidate value is then computed exactly as the reference does,
// f = score + ((x - max) - log(sum)). f is monotone in x, but rounding can make f equal for
// different x, and the reference orders equal f by index. So the row's top-W by (f desc, index
// asc) lie among the buffer entries before the first one whose f is below the W-th's: those are
// re-sorted by (f, index). When no buffered f is below the W-th's (ties of more than 8
// entries, or an infinite score), an exact second pass over the row decides (rare).
// Phase 2 (beam_topk_merge), per batch row: a W-way merge of the W sorted candidate lists under
// the same order (flat index w*V+v breaks ties), then the gather of token history and state.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace redrafter::cpu {
namespace {

using detail::ranks_before;

// A buffered logit and its index, ordered by (x desc, index asc); never NaN (NaN rows stop early).
struct Cand {
  float x;
  int32_t i;
};
inline bool before(const Cand& a, const Cand& b) { return a.x > b.x || (a.x == b.x && a.i < b.i); }

// The reference's candidate value, operation for operation (no fused multiply-add possible).
inline float candidate(float s, float x, float m, float logsum) { return s + ((x - m) - logsum); }

}  // namespace

template <typename T>
void beam_topk_rows(const T* logits, const float* scores, int64_t W, int64_t V, float* cand_score,
                    int32_t* cand_token, int32_t* cand_count, int64_t row_begin, int64_t row_end) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float kNaN = std::numeric_limits<float>::quiet_NaN();
  const int64_t C = std::min(W, V);  // candidates a row contributes
  // the buffer holds S - W extra logits: they absorb exact ties (common in bf16/fp16) and rounding
  // ties at the W-th candidate without a second pass
  const int64_t S = beam_topk_stride(W);
  const int64_t K = std::min(S, V);
  float buf[vec::kBlock];
  int32_t hits[vec::kBlock];
  // candidate pool: < 2K entries before a block appends at most kBlock; allocated once per call
  std::vector<Cand> pool_storage(static_cast<size_t>(2 * K + vec::kBlock));
  Cand* pool = pool_storage.data();
  for (int64_t r = row_begin; r < row_end; ++r) {
    const T* row = logits + r * V;
    const float s = scores[r];
    float* bx = cand_score + r * S;
    int32_t* bi = cand_token + r * S;
    cand_count[r] = static_cast<int32_t>(C);

    // pass 1: online log-sum-exp + top-K logits by (x desc, index asc). Candidates above the
    // threshold (the K-th best so far) are appended to `pool`; when it holds 2K they are cut back to
    // the K best (nth_element), which raises the threshold. An equal value has a later index and
    // loses, so only values strictly above the threshold are kept.
    float m = -kInf;
    double sum = 0.0;
    bool nan = false;
    bool full = false;  // pool has been cut to K entries: thr is the K-th best so far
    float thr = -kInf;
    int64_t n_pool = 0;
    for (int64_t off = 0; off < V; off += vec::kBlock) {
      const int64_t n = std::min(vec::kBlock, V - off);
      const float* x = detail::load_block(row, off, n, buf);
      const vec::BlockMax bm = vec::block_max(x, n);
      if (bm.nan) {  // log_softmax of a row holding a NaN is NaN everywhere
        nan = true;
        break;
      }
      if (bm.max > m) {
        sum = m == -kInf ? 0.0 : sum * std::exp(static_cast<double>(m) - static_cast<double>(bm.max));
        m = bm.max;
      }
      if (m > -kInf) sum += vec::block_sum_exp(x, n, m);
      int64_t j = 0;
      if (!full) {  // the first K values of the row are taken as they come
        for (; j < n && n_pool < K; ++j) pool[n_pool++] = {x[j], static_cast<int32_t>(off + j)};
        if (n_pool < K) continue;
        thr = std::max_element(pool, pool + K, before)->x;  // the entry ranked last
        full = true;
      }
      if (!(bm.max > thr)) continue;
      const int64_t c = vec::collect_above(x + j, n - j, thr, hits);
      for (int64_t k = 0; k < c; ++k) {
        const int64_t at = j + hits[k];
        pool[n_pool++] = {x[at], static_cast<int32_t>(off + at)};
      }
      if (n_pool >= 2 * K) {
        std::nth_element(pool, pool + (K - 1), pool + n_pool, before);
        n_pool = K;
        thr = pool[K - 1].x;
      }
    }
    const int64_t cnt = std::min(n_pool, K);  // K, or V when the row is shorter
    if (!nan) {
      if (n_pool > K) std::nth_element(pool, pool + (K - 1), pool + n_pool, before);
      std::sort(pool, pool + cnt, before);
      for (int64_t j = 0; j < cnt; ++j) {
        bx[j] = pool[j].x;
        bi[j] = pool[j].i;
      }
    }
    const float logsum = static_cast<float>(std::log(sum));

    // torch's log_softmax is NaN on the whole row when the row holds a NaN or +inf, or is all -inf;
    // a -inf running score makes every candidate -inf. Then all candidates tie: first C indices.
    const bool all_nan = nan || !(m > -kInf && m < kInf) || std::isnan(logsum) || std::isnan(s);
    if (all_nan || s == -kInf) {
      for (int64_t j = 0; j < C; ++j) {
        bx[j] = all_nan ? kNaN : -kInf;
        bi[j] = static_cast<int32_t>(j);
      }
      continue;
    }
    // s = +inf: inf + (-inf) = NaN for -inf logits, leave it to pass 2
    int64_t keep = 0;  // the row's top-C are among the first `keep` buffered entries
    if (s < kInf) {
      for (int64_t j = 0; j < cnt; ++j) bx[j] = candidate(s, bx[j], m, logsum);
      keep = C;
      while (keep < cnt && bx[keep] == bx[C - 1]) ++keep;
      if (keep == cnt && cnt < V) keep = 0;  // an unbuffered value may still tie the C-th
    }
    if (keep > 0) {
      // equal f from different x (rounding) must be ordered by index, like the stable sort
      for (int64_t j = 1; j < keep; ++j) {
        const float f = bx[j];
        const int32_t i = bi[j];
        int64_t p = j;
        while (p > 0 && ranks_before(f, i, bx[p - 1], bi[p - 1])) {
          bx[p] = bx[p - 1];
          bi[p] = bi[p - 1];
          --p;
        }
        bx[p] = f;
        bi[p] = i;
      }
      continue;
    }

    // pass 2 (rare): exact top-C by (f, index) over the whole row
    int64_t n2 = 0;
    for (int64_t off = 0; off < V; off += vec::kBlock) {
      const int64_t n = std::min(vec::kBlock, V - off);
      const float* x = detail::load_block(row, off, n, buf);
      for (int64_t j = 0; j < n; ++j) {
        const float f = candidate(s, x[j], m, logsum);
        const int64_t idx = off + j;
        if (n2 == C && !ranks_before(f, idx, bx[C - 1], bi[C - 1])) continue;
        int64_t p = n2 < C ? n2++ : C - 1;
        while (p > 0 && ranks_before(f, idx, bx[p - 1], bi[p - 1])) {
          bx[p] = bx[p - 1];
          bi[p] = bi[p - 1];
          --p;
        }
        bx[p] = f;
        bi[p] = static_cast<int32_t>(idx);
      }
    }
  }
}

template <typename I>
void beam_topk_merge(const float* cand_score, const int32_t* cand_token, const int32_t* cand_count,
                     const I* tokens, const uint8_t* state, int64_t W, int64_t V, int64_t L, int64_t step,
                     int64_t state_row_bytes, float* scores_out, int32_t* tokens_out, uint8_t* state_out,
                     int32_t* parent_out, int32_t* heads, int64_t b_begin, int64_t b_end) {
  const int64_t S = beam_topk_stride(W);
  for (int64_t b = b_begin; b < b_end; ++b) {
    int32_t* head = heads + b * W;
    std::fill(head, head + W, 0);
    for (int64_t j = 0; j < W; ++j) {
      int64_t best = -1;
      float best_f = 0.0f;
      int64_t best_flat = 0;
      for (int64_t w = 0; w < W; ++w) {
        const int64_t r = b * W + w;
        if (head[w] >= cand_count[r]) continue;
        const int64_t k = r * S + head[w];
        const float f = cand_score[k];
        const int64_t flat = w * V + cand_token[k];
        if (best < 0 || ranks_before(f, flat, best_f, best_flat)) {
          best = w;
          best_f = f;
          best_flat = flat;
        }
      }
      // W*min(W, V) >= W candidates exist, so best >= 0
      const int64_t src = b * W + best;
      const int64_t dst = b * W + j;
      const int32_t token = cand_token[src * S + head[best]];
      ++head[best];
      scores_out[dst] = best_f;
      parent_out[dst] = static_cast<int32_t>(best);
      const I* from = tokens + src * L;
      int32_t* to = tokens_out + dst * L;
      for (int64_t t = 0; t < L; ++t) to[t] = static_cast<int32_t>(from[t]);
      to[step] = token;
      if (state_row_bytes > 0) {
        std::memcpy(state_out + dst * state_row_bytes, state + src * state_row_bytes,
                    static_cast<size_t>(state_row_bytes));
      }
    }
  }
}

#define RD_ROWS(T)                                                                                    \
  template void beam_topk_rows<T>(const T*, const float*, int64_t, int64_t, float*, int32_t*, int32_t*, \
                                  int64_t, int64_t);
RD_ROWS(float)
RD_ROWS(Half)
RD_ROWS(BFloat16)
#undef RD_ROWS
#define RD_MERGE(I)                                                                                       \
  template void beam_topk_merge<I>(const float*, const int32_t*, const int32_t*, const I*, const uint8_t*, \
                                   int64_t, int64_t, int64_t, int64_t, int64_t, float*, int32_t*, uint8_t*, \
                                   int32_t*, int32_t*, int64_t, int64_t);
RD_MERGE(int32_t)
RD_MERGE(int64_t)
#undef RD_MERGE

}  // namespace redrafter::cpu
