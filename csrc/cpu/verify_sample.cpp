// Exact sampling by recursive rejection over the trie (the sampling counterpart of verify_greedy).
//
// Per row: the processed target distribution p of the current node (temperature, top-k, top-p, in
// float64) is computed only for the nodes the walk reaches (at most L of them). The node's distinct
// children are tried in beam order; the j-th, token t, is accepted when u * mass < p[t] with
// u = accept_u[b, depth, j] and mass the index-order sum of the not yet rejected p; a rejected
// child's p[t] becomes 0. The walk continues at an accepted child, and stops when every child is
// rejected or at depth L-1; the next token is drawn from the remaining p by inverse CDF with
// sample_u[b]. Every floating-point step is the one of reference.verify_sample (float64, sums in
// index order, sorts stable), so the decisions are the reference's given the same uniforms.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/rows.h"

namespace redrafter::cpu {
namespace {

double seq_sum(const double* p, int64_t V) {
  double s = 0.0;
  for (int64_t v = 0; v < V; ++v) s += p[v];
  return s;
}

// p[0..V) = reference.sampling_probs of one logits row. work: V doubles, order: V ints.
template <typename T>
void node_probs(const T* row, int64_t V, double inv_t, int64_t top_k, double top_p, double* p, double* work,
                int32_t* order) {
  float buf[vec::kBlock];
  for (int64_t off = 0; off < V; off += vec::kBlock) {
    const int64_t n = std::min(vec::kBlock, V - off);
    const float* x = detail::load_block(row, off, n, buf);
    for (int64_t j = 0; j < n; ++j) p[off + j] = static_cast<double>(x[j]) * inv_t;
  }
  bool has_nan = false;
  for (int64_t v = 0; v < V; ++v) has_nan |= std::isnan(p[v]);
  if (top_k > 0 && top_k < V) {
    // the k-th largest value (torch.topk ranks NaN above everything: map it to +inf here)
    for (int64_t v = 0; v < V; ++v) work[v] = std::isnan(p[v]) ? std::numeric_limits<double>::infinity() : p[v];
    std::nth_element(work, work + (top_k - 1), work + V, std::greater<double>());
    const double thr = work[top_k - 1];
    for (int64_t v = 0; v < V; ++v) {
      if (!(p[v] >= thr)) p[v] = -std::numeric_limits<double>::infinity();
    }
  }
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t v = 0; v < V; ++v) {
    if (std::isnan(p[v]) || p[v] > m) m = p[v];
    if (std::isnan(m)) break;
  }
  for (int64_t v = 0; v < V; ++v) p[v] = std::exp(p[v] - m);
  const double z = seq_sum(p, V);
  for (int64_t v = 0; v < V; ++v) p[v] /= z;
  if (top_p < 1.0 && !has_nan && !std::isnan(z)) {
    std::iota(order, order + V, 0);
    std::stable_sort(order, order + V, [p](int32_t a, int32_t b) { return p[a] > p[b]; });
    double excl = 0.0;
    int64_t kept = 0;
    while (kept < V && excl < top_p) excl += p[order[kept++]];
    for (int64_t i = kept; i < V; ++i) p[order[i]] = 0.0;
    const double z2 = seq_sum(p, V);
    for (int64_t v = 0; v < V; ++v) p[v] /= z2;
  }
}

// reference.sample_inverse_cdf: count of prefix sums <= u * total, clamped to the last positive p.
int32_t inverse_cdf(const double* p, int64_t V, float u) {
  const double total = seq_sum(p, V);
  const double thr = static_cast<double>(u) * total;
  double c = 0.0;
  int64_t count = 0, last_pos = 0;
  for (int64_t v = 0; v < V; ++v) {
    c += p[v];
    count += c <= thr;
    if (p[v] > 0) last_pos = v;
  }
  return static_cast<int32_t>(std::min(count, last_pos));
}

}  // namespace

template <typename T, typename I>
void verify_sample(const T* logits, int64_t n_logit_rows, int64_t V, const I* beams, const I* beam_node, int64_t W,
                   int64_t L, const float* accept_u, const float* sample_u, double temperature, int64_t top_k,
                   double top_p, int32_t* accept_len, int32_t* best_beam, int32_t* path_nodes, int32_t* next_token,
                   int64_t row_begin, int64_t row_end) {
  const double inv_t = 1.0 / temperature;
  std::vector<double> p(V), work(V);
  std::vector<int32_t> order(V);
  for (int64_t b = row_begin; b < row_end; ++b) {
    const T* rows = logits + b * n_logit_rows * V;
    const I* beam = beams + b * W * L;
    const I* bn = beam_node + b * W * L;
    auto probs_at = [&](int64_t node) {
      node_probs(rows + node * V, V, inv_t, top_k, top_p, p.data(), work.data(), order.data());
    };
    int64_t cur = static_cast<int64_t>(bn[0]);
    int64_t a = 0;
    probs_at(cur);
    for (int64_t d = 0; d + 1 < L; ++d) {
      int64_t child = -1, rank = 0;
      for (int64_t w = 0; w < W && child < 0; ++w) {
        if (static_cast<int64_t>(bn[w * L + d]) != cur) continue;
        const I c = bn[w * L + d + 1];
        bool seen = false;  // a lower beam already brought this child
        for (int64_t v = 0; v < w && !seen; ++v) seen = bn[v * L + d + 1] == c;
        if (seen) continue;
        const int64_t t = static_cast<int64_t>(beam[w * L + d + 1]);
        const double mass = seq_sum(p.data(), V);
        const double u = static_cast<double>(accept_u[(b * (L - 1) + d) * W + rank]);
        ++rank;
        if (u * mass < p[t]) {
          child = static_cast<int64_t>(c);
        } else {
          p[t] = 0.0;
        }
      }
      if (child < 0) break;  // every child rejected: sample from the residual
      cur = child;
      ++a;
      probs_at(cur);
    }
    int64_t best = 0;
    while (best < W - 1 && static_cast<int64_t>(bn[best * L + a]) != cur) ++best;
    accept_len[b] = static_cast<int32_t>(a);
    best_beam[b] = static_cast<int32_t>(best);
    for (int64_t i = 0; i < L; ++i) path_nodes[b * L + i] = i <= a ? static_cast<int32_t>(bn[best * L + i]) : -1;
    next_token[b] = inverse_cdf(p.data(), V, sample_u[b]);
  }
}

#define RD_VERIFY_SAMPLE(T, I)                                                                                    \
  template void verify_sample<T, I>(const T*, int64_t, int64_t, const I*, const I*, int64_t, int64_t, const float*, \
                                    const float*, double, int64_t, double, int32_t*, int32_t*, int32_t*, int32_t*,  \
                                    int64_t, int64_t);
RD_VERIFY_SAMPLE(float, int32_t)
RD_VERIFY_SAMPLE(float, int64_t)
RD_VERIFY_SAMPLE(Half, int32_t)
RD_VERIFY_SAMPLE(Half, int64_t)
RD_VERIFY_SAMPLE(BFloat16, int32_t)
RD_VERIFY_SAMPLE(BFloat16, int64_t)
#undef RD_VERIFY_SAMPLE

}  // namespace redrafter::cpu
