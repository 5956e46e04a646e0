// CPU launcher of kv_compact_paged: metadata checks (torch/checks.h), then every value the kernel
// will use, all before the first byte of kv_pages or cache_len is written.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "cpu/kernels.h"
#include "torch/checks.h"

namespace redrafter {
namespace {

constexpr const char* kOp = "kv_compact_paged";

// Range checks of one row; appends (physical block, row, logical block) of every block the row
// reads or writes to `touched`.
template <typename I>
void check_paged_row(int64_t b, const int32_t* table, int64_t max_blocks, int64_t block_size, int64_t num_blocks,
                     int64_t c, const I* path, int64_t L, int64_t a,
                     std::vector<std::tuple<int64_t, int64_t, int64_t>>& touched) {
  const int64_t S = max_blocks * block_size;
  TORCH_CHECK_VALUE(a >= -1 && a <= L - 1, kOp, ": accept_len[", b, "] = ", a, " must be in [-1, L-1 = ", L - 1,
                    "] (-1: inactive row)");
  TORCH_CHECK_VALUE(c >= 0 && c <= S, kOp, ": cache_len[", b, "] = ", c, " must be in [0, S = ", S,
                    "] (S = max_blocks * block_size)");
  auto block_of = [&](int64_t s) {
    const int64_t j = s / block_size, p = table[j];
    TORCH_CHECK_VALUE(p >= 0 && p < num_blocks, kOp, ": block_table[", b, ", ", j, "] = ", p,
                      " is not a block id in [0, num_blocks = ", num_blocks, ") (slot ", s, " of row ", b,
                      " is read or written)");
    touched.emplace_back(p, b, j);
  };
  for (int64_t i = 0; i <= a; ++i) {
    const int64_t p = static_cast<int64_t>(path[i]);
    TORCH_CHECK_VALUE(p >= i, kOp, ": path_nodes[", b, ", ", i, "] = ", p,
                      " must satisfy path_nodes[b, i] >= i (an accepted node is never before its position)");
    TORCH_CHECK_VALUE(c + p < S, kOp, ": cache_len[", b, "] + path_nodes[", b, ", ", i, "] = ", c, " + ", p,
                      " exceeds the row capacity S = max_blocks * block_size = ", S);
    block_of(c + i);
    block_of(c + p);
  }
}

void kv_compact_paged_cpu(const at::Tensor& kv_pages, const at::Tensor& block_table_in, const at::Tensor& cache_len,
                          const at::Tensor& path_nodes_in, const at::Tensor& accept_len_in) {
  check_kv_compact_paged_inputs(kv_pages, block_table_in, cache_len, path_nodes_in, accept_len_in);
  TORCH_CHECK_VALUE(kv_pages.is_cpu(), kOp, ": kv_pages must be a CPU tensor for the CPU kernel");
  const KvCompactArgs args = prepare_kv_compact(cache_len, path_nodes_in, accept_len_in);
  const auto& [path_nodes, accept_len, lens, idx] = args;
  const at::Tensor block_table = block_table_in.contiguous();
  const int64_t n_layers = kv_pages.size(0), num_blocks = kv_pages.size(1), H = kv_pages.size(3);
  const int64_t block_size = kv_pages.size(4), B = block_table.size(0), max_blocks = block_table.size(1);
  const int64_t L = path_nodes.size(1);
  const int64_t slot_bytes = kv_pages.size(5) * static_cast<int64_t>(kv_pages.element_size());
  AT_DISPATCH_INDEX_TYPES(idx, "kv_compact_paged", [&] {
    const index_t* path = path_nodes.const_data_ptr<index_t>();
    const index_t* acc = accept_len.const_data_ptr<index_t>();
    const int32_t* len = lens.const_data_ptr<int32_t>();
    const int32_t* table = block_table.const_data_ptr<int32_t>();
    std::vector<std::tuple<int64_t, int64_t, int64_t>> touched;
    for (int64_t b = 0; b < B; ++b) {
      check_paged_row(b, table + b * max_blocks, max_blocks, block_size, num_blocks, len[b], path + b * L, L,
                      static_cast<int64_t>(acc[b]), touched);
    }
    // a physical block reached from two (row, logical block) pairs would make the in-place copies
    // order-dependent (and means two rows write one block): rejected
    std::sort(touched.begin(), touched.end());
    for (size_t t = 1; t < touched.size(); ++t) {
      const auto& [p0, b0, j0] = touched[t - 1];
      const auto& [p1, b1, j1] = touched[t];
      TORCH_CHECK_VALUE(p0 != p1 || (b0 == b1 && j0 == j1), kOp, ": block_table[", b0, ", ", j0,
                        "] and block_table[", b1, ", ", j1, "] are both block ", p1,
                        ": the blocks a step reads or writes must belong to one (row, logical block) each");
    }
    if (kv_pages.numel() > 0) {
      const int64_t units = n_layers * 2 * B * H;
      const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, L * slot_bytes));
      uint8_t* base = static_cast<uint8_t*>(kv_pages.mutable_data_ptr());
      at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
        cpu::kv_compact_paged<index_t>(base, num_blocks, B, H, block_size, slot_bytes, table, max_blocks, len, path,
                                       L, acc, u0, u1);
      });
    }
    cpu::kv_compact_advance<index_t>(lens.mutable_data_ptr<int32_t>(), acc, B);
  });
  finish_kv_compact(cache_len, args);
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CPU, m) { m.impl("kv_compact_paged", &kv_compact_paged_cpu); }

}  // namespace redrafter
