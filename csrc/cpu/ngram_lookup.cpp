// Prompt-lookup drafts. One backward scan per row over the candidate ends e of an occurrence
// (e <= n_b - 2, so a continuation token exists), measuring how many trailing tokens at e equal the
// row's last ones: the longest run wins and, scanning backwards, the first end that reaches it is
// the latest. A run of the longest possible key ends the scan at once. O(S * max_n) compares.
#include <algorithm>

#include "cpu/kernels.h"

namespace redrafter::cpu {

template <typename I>
void ngram_lookup(const I* tokens, const I* length, int64_t S, int64_t max_n, int64_t m, int32_t* drafts,
                  int64_t row_begin, int64_t row_end) {
  for (int64_t b = row_begin; b < row_end; ++b) {
    const I* t = tokens + b * S;
    int32_t* out = drafts + b * m;
    const int64_t n_b = std::clamp<int64_t>(static_cast<int64_t>(length[b]), 0, S);
    const int64_t cap = std::min<int64_t>(max_n, n_b - 1);  // the longest key that can occur earlier
    int64_t best_run = 0, best_end = -1;
    for (int64_t e = n_b - 2; e >= 0 && best_run < cap; --e) {
      const int64_t limit = std::min<int64_t>(cap, e + 1);
      int64_t run = 0;
      while (run < limit && t[e - run] == t[n_b - 1 - run]) ++run;
      if (run > best_run) best_run = run, best_end = e;
    }
    if (best_run == 0) {
      std::fill(out, out + m, -1);
      continue;
    }
    const int64_t q = best_end + 1, period = n_b - q;
    for (int64_t k = 0; k < m; ++k) out[k] = static_cast<int32_t>(t[q + k % period]);
  }
}

template void ngram_lookup<int32_t>(const int32_t*, const int32_t*, int64_t, int64_t, int64_t, int32_t*, int64_t,
                                    int64_t);
template void ngram_lookup<int64_t>(const int64_t*, const int64_t*, int64_t, int64_t, int64_t, int32_t*, int64_t,
                                    int64_t);

}  // namespace redrafter::cpu
