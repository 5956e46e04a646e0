// CPU launchers: validate every input (metadata, then values), allocate, split rows over threads.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cpu/kernels.h"
#include "torch/checks.h"
#include "torch/registration.h"

namespace redrafter {

namespace {

// Calls f with a null pointer of the C++ type of a float32/float16/bfloat16 tensor.
template <typename F>
void dispatch_float(at::ScalarType t, const char* op, F&& f) {
  switch (t) {
    case at::kFloat:
      f(static_cast<float*>(nullptr));
      break;
    case at::kHalf:
      f(static_cast<c10::Half*>(nullptr));
      break;
    case at::kBFloat16:
      f(static_cast<c10::BFloat16*>(nullptr));
      break;
    default:
      TORCH_CHECK_TYPE(false, op, ": unsupported dtype ", t);
  }
}

constexpr int64_t kMaxToken = std::numeric_limits<int32_t>::max();

template <typename I>
void check_tree_values(const I* parent, const I* num_nodes, int64_t B, int64_t N) {
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = static_cast<int64_t>(num_nodes[b]);
    TORCH_CHECK_VALUE(n >= 0 && n <= N, "tree_mask: num_nodes[", b, "] = ", n, " is outside [0, N=", N, "]");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = static_cast<int64_t>(parent[b * N + i]);
      TORCH_CHECK_VALUE(p >= -1 && p < i, "tree_mask: node_parent[", b, ", ", i, "] = ", p,
                        " must be -1 or a lower node index (parents precede children)");
    }
  }
}

at::Tensor tree_mask_cpu(const at::Tensor& node_parent_in, const at::Tensor& num_nodes_in, bool packed) {
  check_tree_mask_inputs(node_parent_in, num_nodes_in);
  TORCH_CHECK_VALUE(node_parent_in.is_cpu(), "tree_mask: node_parent must be a CPU tensor for the CPU kernel");
  const auto idx = common_index_type(node_parent_in, num_nodes_in);
  const at::Tensor node_parent = node_parent_in.to(idx).contiguous();
  const at::Tensor num_nodes = num_nodes_in.to(idx).contiguous();
  const int64_t B = node_parent.size(0), N = node_parent.size(1);
  at::Tensor out = packed ? at::empty({B, N, (N + 31) / 32}, node_parent.options().dtype(at::kInt))
                          : at::empty({B, N, N}, node_parent.options().dtype(at::kBool));
  AT_DISPATCH_INDEX_TYPES(idx, "tree_mask", [&] {
    const index_t* parent = node_parent.const_data_ptr<index_t>();
    const index_t* nn = num_nodes.const_data_ptr<index_t>();
    check_tree_values(parent, nn, B, N);
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, N * N));
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      if (packed) {
        cpu::tree_mask_packed(parent, nn, N, out.mutable_data_ptr<int32_t>(), b0, b1);
      } else {
        cpu::tree_mask_bool(parent, nn, N, out.mutable_data_ptr<bool>(), b0, b1);
      }
    });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// beam_topk

Tensors4 beam_topk_cpu(const at::Tensor& logits_in, const at::Tensor& scores_in, const at::Tensor& tokens_in,
                       const at::Tensor& state_in, int64_t step) {
  check_beam_topk_inputs(logits_in, scores_in, tokens_in, state_in, step);
  TORCH_CHECK_VALUE(logits_in.is_cpu(), "beam_topk: logits must be a CPU tensor for the CPU kernel");
  const BeamTopkArgs a = prepare_beam_topk(logits_in, scores_in, tokens_in, state_in);
  const auto& [logits, scores, tokens, state, B, W, V, L, D, scores_out, tokens_out, state_out, parent_out] = a;
  AT_DISPATCH_INDEX_TYPES(tokens.scalar_type(), "beam_topk", [&] {
    const index_t* t = tokens.const_data_ptr<index_t>();
    for (int64_t r = 0; r < B * W; ++r) {
      for (int64_t i = 0; i < step; ++i) {
        const int64_t v = static_cast<int64_t>(t[r * L + i]);
        TORCH_CHECK_VALUE(v >= 0 && v <= kMaxToken, "beam_topk: tokens[", r / W, ", ", r % W, ", ", i, "] = ", v,
                          " is not a token id in [0, 2^31) (positions < step must be valid)");
      }
    }
  });

  const auto i32 = logits.options().dtype(at::kInt);
  const auto f32 = logits.options().dtype(at::kFloat);
  // working space: each row's sorted candidates (+ slack), their count, merge heads
  at::Tensor cand_score = at::empty({B * W, cpu::beam_topk_stride(W)}, f32);
  at::Tensor cand_token = at::empty({B * W, cpu::beam_topk_stride(W)}, i32);
  at::Tensor cand_count = at::empty({B * W}, i32);
  at::Tensor heads = at::empty({B, W}, i32);

  dispatch_float(logits.scalar_type(), "beam_topk", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = logits.const_data_ptr<T>();
    const float* s = scores.const_data_ptr<float>();
    at::parallel_for(0, B * W, std::max<int64_t>(1, 32768 / V), [&](int64_t r0, int64_t r1) {
      cpu::beam_topk_rows<T>(x, s, W, V, cand_score.mutable_data_ptr<float>(), cand_token.mutable_data_ptr<int32_t>(),
                             cand_count.mutable_data_ptr<int32_t>(), r0, r1);
    });
  });
  const int64_t row_bytes = D * static_cast<int64_t>(state.element_size());
  AT_DISPATCH_INDEX_TYPES(tokens.scalar_type(), "beam_topk", [&] {
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, W * (W + L * 4 + row_bytes)));
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      cpu::beam_topk_merge<index_t>(
          cand_score.const_data_ptr<float>(), cand_token.const_data_ptr<int32_t>(),
          cand_count.const_data_ptr<int32_t>(), tokens.const_data_ptr<index_t>(),
          static_cast<const uint8_t*>(state.const_data_ptr()), W, V, L, step, row_bytes,
          scores_out.mutable_data_ptr<float>(), tokens_out.mutable_data_ptr<int32_t>(),
          static_cast<uint8_t*>(state_out.mutable_data_ptr()), parent_out.mutable_data_ptr<int32_t>(),
          heads.mutable_data_ptr<int32_t>(), b0, b1);
    });
  });
  return a.outputs();
}

// ---------------------------------------------------------------------------------------------
// build_trie

template <typename I>
void check_token_ids(const char* op, const char* name, const I* t, int64_t B, int64_t W, int64_t L) {
  for (int64_t k = 0; k < B * W * L; ++k) {
    const int64_t v = static_cast<int64_t>(t[k]);
    TORCH_CHECK_VALUE(v >= 0 && v <= kMaxToken, op, ": ", name, "[", k / (W * L), ", ", (k / L) % W, ", ", k % L,
                      "] = ", v, " is not a token id in [0, 2^31)");
  }
}

Tensors5 build_trie_cpu(const at::Tensor& beams_in) {
  check_build_trie_inputs(beams_in);
  TORCH_CHECK_VALUE(beams_in.is_cpu(), "build_trie: beams must be a CPU tensor for the CPU kernel");
  const BuildTrieArgs a = prepare_build_trie(beams_in);
  const auto& [beams, B, W, L, N, node_token, node_parent, node_depth, beam_node, num_nodes] = a;
  AT_DISPATCH_INDEX_TYPES(beams.scalar_type(), "build_trie", [&] {
    const index_t* x = beams.const_data_ptr<index_t>();
    check_token_ids("build_trie", "beams", x, B, W, L);
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, W * W * L));
    at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
      cpu::build_trie<index_t>(x, W, L, node_token.mutable_data_ptr<int32_t>(), node_parent.mutable_data_ptr<int32_t>(),
                               node_depth.mutable_data_ptr<int32_t>(), beam_node.mutable_data_ptr<int32_t>(),
                               num_nodes.mutable_data_ptr<int32_t>(), b0, b1);
    });
  });
  return a.outputs();
}

// ---------------------------------------------------------------------------------------------
// ngram_lookup

at::Tensor ngram_lookup_cpu(const at::Tensor& tokens_in, const at::Tensor& length_in, int64_t max_n, int64_t m) {
  check_ngram_lookup_inputs(tokens_in, length_in, max_n, m);
  TORCH_CHECK_VALUE(tokens_in.is_cpu(), "ngram_lookup: tokens must be a CPU tensor for the CPU kernel");
  const NgramLookupArgs a = prepare_ngram_lookup(tokens_in, length_in, m);
  AT_DISPATCH_INDEX_TYPES(a.idx, "ngram_lookup", [&] {
    const index_t* len = a.length.const_data_ptr<index_t>();
    for (int64_t b = 0; b < a.B; ++b) {
      const int64_t n = static_cast<int64_t>(len[b]);
      TORCH_CHECK_VALUE(n >= 0 && n <= a.S, "ngram_lookup: length[", b, "] = ", n, " is outside [0, S=", a.S, "]");
    }
    const index_t* t = a.tokens.const_data_ptr<index_t>();
    const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, a.S * max_n));
    at::parallel_for(0, a.B, grain, [&](int64_t b0, int64_t b1) {
      cpu::ngram_lookup<index_t>(t, len, a.S, max_n, m, a.drafts.mutable_data_ptr<int32_t>(), b0, b1);
    });
  });
  return a.drafts;
}

// ---------------------------------------------------------------------------------------------
// verify_greedy

// Every beam_node value must be a node of logits (dim 1, n_logit_rows nodes); `also(k)` then checks more of
// position k, so that the first bad position (in memory order) is the one reported.
template <typename I, typename F>
void check_node_ids(const char* op, const I* bn, int64_t B, int64_t W, int64_t L, int64_t n_logit_rows, F&& also) {
  for (int64_t k = 0; k < B * W * L; ++k) {
    const int64_t n = static_cast<int64_t>(bn[k]);
    TORCH_CHECK_VALUE(n >= 0 && n < n_logit_rows, op, ": beam_node[", k / (W * L), ", ", (k / L) % W, ", ", k % L,
                      "] = ", n, " is outside the ", n_logit_rows, " nodes of logits (dim 1)");
    also(k);
  }
}

Tensors4 verify_greedy_cpu(const at::Tensor& logits_in, const at::Tensor& beams_in,
                           const at::Tensor& beam_node_in) {
  check_verify_greedy_inputs(logits_in, beams_in, beam_node_in);
  TORCH_CHECK_VALUE(logits_in.is_cpu(), "verify_greedy: logits must be a CPU tensor for the CPU kernel");
  const VerifyArgs v = prepare_verify(logits_in, beams_in, beam_node_in);
  const auto& [logits, beams, beam_node, idx, B, W, L, n_logit_rows, V, accept_len, best_beam, path_nodes,
                next_token] = v;
  at::Tensor argmax = at::empty({B, n_logit_rows}, logits.options().dtype(at::kInt));  // per-node argmax cache
  AT_DISPATCH_INDEX_TYPES(idx, "verify_greedy", [&] {
    const index_t* bm = beams.const_data_ptr<index_t>();
    const index_t* bn = beam_node.const_data_ptr<index_t>();
    check_token_ids("verify_greedy", "beams", bm, B, W, L);
    check_node_ids("verify_greedy", bn, B, W, L, n_logit_rows, [](int64_t) {});
    dispatch_float(logits.scalar_type(), "verify_greedy", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      // about L argmaxes of V per row
      const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, L * V));
      at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
        cpu::verify_greedy<T, index_t>(logits.const_data_ptr<T>(), n_logit_rows, V, bm, bn, W, L,
                                       argmax.mutable_data_ptr<int32_t>(), accept_len.mutable_data_ptr<int32_t>(),
                                       best_beam.mutable_data_ptr<int32_t>(), path_nodes.mutable_data_ptr<int32_t>(),
                                       next_token.mutable_data_ptr<int32_t>(), b0, b1);
      });
    });
  });
  return v.outputs();
}

// ---------------------------------------------------------------------------------------------
// verify_sample: every value (token ids, node ids, uniforms) is checked before anything is computed

Tensors4 verify_sample_cpu(
    const at::Tensor& logits_in, const at::Tensor& beams_in, const at::Tensor& beam_node_in,
    const at::Tensor& accept_u_in, const at::Tensor& sample_u_in, double temperature, int64_t top_k, double top_p) {
  check_verify_sample_inputs(logits_in, beams_in, beam_node_in, accept_u_in, sample_u_in, temperature, top_k, top_p);
  TORCH_CHECK_VALUE(logits_in.is_cpu(), "verify_sample: logits must be a CPU tensor for the CPU kernel");
  const at::Tensor accept_u = accept_u_in.contiguous();
  const at::Tensor sample_u = sample_u_in.contiguous();
  {
    const float* u = accept_u.const_data_ptr<float>();
    const int64_t W = accept_u.size(2), D = accept_u.size(1);
    for (int64_t k = 0; k < accept_u.numel(); ++k) {
      TORCH_CHECK_VALUE(u[k] >= 0.0f && u[k] < 1.0f, "verify_sample: accept_u[", k / (D * W), ", ", (k / W) % D, ", ",
                        k % W, "] = ", u[k], " is not a uniform in [0, 1)");
    }
    const float* s = sample_u.const_data_ptr<float>();
    for (int64_t b = 0; b < sample_u.numel(); ++b) {
      TORCH_CHECK_VALUE(s[b] >= 0.0f && s[b] < 1.0f, "verify_sample: sample_u[", b, "] = ", s[b],
                        " is not a uniform in [0, 1)");
    }
  }
  if (temperature == 0.0) return verify_greedy_cpu(logits_in, beams_in, beam_node_in);  // greedy, exactly
  const VerifyArgs v = prepare_verify(logits_in, beams_in, beam_node_in);
  const auto& [logits, beams, beam_node, idx, B, W, L, n_logit_rows, V, accept_len, best_beam, path_nodes,
                next_token] = v;
  AT_DISPATCH_INDEX_TYPES(idx, "verify_sample", [&] {
    const index_t* bm = beams.const_data_ptr<index_t>();
    const index_t* bn = beam_node.const_data_ptr<index_t>();
    check_token_ids("verify_sample", "beams", bm, B, W, L);
    check_node_ids("verify_sample", bn, B, W, L, n_logit_rows, [&](int64_t k) {
      TORCH_CHECK_VALUE(k % L == 0 || static_cast<int64_t>(bm[k]) < V, "verify_sample: beams[", k / (W * L), ", ",
                        (k / L) % W, ", ", k % L, "] = ", static_cast<int64_t>(bm[k]),
                        " is a draft token outside the vocabulary V = ", V, " (logits dim 2)");
    });
    dispatch_float(logits.scalar_type(), "verify_sample", [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      // about L softmaxes (and W sums) of V per row
      const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, L * (W + 4) * V));
      at::parallel_for(0, B, grain, [&](int64_t b0, int64_t b1) {
        cpu::verify_sample<T, index_t>(logits.const_data_ptr<T>(), n_logit_rows, V, bm, bn, W, L,
                                       accept_u.const_data_ptr<float>(), sample_u.const_data_ptr<float>(),
                                       temperature, top_k, top_p, accept_len.mutable_data_ptr<int32_t>(),
                                       best_beam.mutable_data_ptr<int32_t>(), path_nodes.mutable_data_ptr<int32_t>(),
                                       next_token.mutable_data_ptr<int32_t>(), b0, b1);
      });
    });
  });
  return v.outputs();
}

// ---------------------------------------------------------------------------------------------
// kv_compact (in place): every value is checked before the first byte of kv or cache_len is written

void kv_compact_cpu(const at::Tensor& kv, const at::Tensor& cache_len, const at::Tensor& path_nodes_in,
                    const at::Tensor& accept_len_in) {
  check_kv_compact_inputs(kv, cache_len, path_nodes_in, accept_len_in);
  TORCH_CHECK_VALUE(kv.is_cpu(), "kv_compact: kv must be a CPU tensor for the CPU kernel");
  const KvCompactArgs args = prepare_kv_compact(cache_len, path_nodes_in, accept_len_in);
  const auto& [path_nodes, accept_len, lens, idx] = args;
  const int64_t B = kv.size(2), H = kv.size(3), S = kv.size(4), L = path_nodes.size(1);
  const int64_t slot_bytes = kv.size(5) * static_cast<int64_t>(kv.element_size());
  AT_DISPATCH_INDEX_TYPES(idx, "kv_compact", [&] {
    const index_t* path = path_nodes.const_data_ptr<index_t>();
    const index_t* acc = accept_len.const_data_ptr<index_t>();
    const int32_t* len = lens.const_data_ptr<int32_t>();
    for (int64_t b = 0; b < B; ++b) {
      check_kv_row("kv_compact", b, len[b], path + b * L, L, static_cast<int64_t>(acc[b]), S, "kv.shape[4]");
    }
    if (kv.numel() > 0) {
      const int64_t units = kv.size(0) * 2 * B * H;
      const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, L * slot_bytes));
      uint8_t* base = static_cast<uint8_t*>(kv.mutable_data_ptr());
      at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
        cpu::kv_compact<index_t>(base, B, H, S, slot_bytes, len, path, L, acc, u0, u1);
      });
    }
    cpu::kv_compact_advance<index_t>(lens.mutable_data_ptr<int32_t>(), acc, B);
  });
  finish_kv_compact(cache_len, args);
}

// ---------------------------------------------------------------------------------------------
// kv_compact_paged (in place): every value, block ids included, is checked before anything is written

constexpr const char* kOp = "kv_compact_paged";

// check_kv_row on one row; appends (physical block, row, logical block) of every block the row
// reads or writes to `touched`.
template <typename I>
void check_paged_row(int64_t b, const int32_t* table, int64_t max_blocks, int64_t block_size, int64_t num_blocks,
                     int64_t c, const I* path, int64_t L, int64_t a,
                     std::vector<std::tuple<int64_t, int64_t, int64_t>>& touched) {
  auto block_of = [&](int64_t s) {
    const int64_t j = s / block_size, p = table[j];
    TORCH_CHECK_VALUE(p >= 0 && p < num_blocks, kOp, ": block_table[", b, ", ", j, "] = ", p,
                      " is not a block id in [0, num_blocks = ", num_blocks, ") (slot ", s, " of row ", b,
                      " is read or written)");
    touched.emplace_back(p, b, j);
  };
  check_kv_row(kOp, b, c, path, L, a, max_blocks * block_size, "max_blocks * block_size");
  for (int64_t i = 0; i <= a; ++i) {
    block_of(c + i);
    block_of(c + static_cast<int64_t>(path[i]));
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

// ---------------------------------------------------------------------------------------------
// skinny_linear: CPU only (on CUDA a GEMM library already reads the weight once at small M)

at::Tensor skinny_linear_cpu(const at::Tensor& x_in, const at::Tensor& packed_in, int64_t out_features,
                             const std::optional<at::Tensor>& bias_in) {
  constexpr const char* op = "skinny_linear";
  constexpr int64_t NR = cpu::kSkinnyTileRows, KB = cpu::kSkinnyTileDepth;
  TORCH_CHECK_VALUE(x_in.dim() == 2, op, ": x must be 2-D (M, K), got ", x_in.dim(), " dims");
  TORCH_CHECK_VALUE(out_features >= 0, op, ": out_features must be >= 0, got ", out_features);
  const int64_t M = x_in.size(0), K = x_in.size(1), N = out_features;
  const int64_t tiles = (N + NR - 1) / NR, kblocks = (K + KB - 1) / KB;
  TORCH_CHECK_VALUE(packed_in.dim() == 4 && packed_in.size(0) == tiles && packed_in.size(1) == kblocks &&
                        packed_in.size(2) == NR && packed_in.size(3) == KB,
                    op, ": packed must have shape (ceil(out_features/4), ceil(K/16), 4, 16) = (", tiles, ", ",
                    kblocks, ", 4, 16) for out_features=", N, " and x's K=", K, ", got ", packed_in.sizes());
  TORCH_CHECK_TYPE(x_in.scalar_type() == at::kFloat, op, ": x must be float32, got ", x_in.scalar_type());
  TORCH_CHECK_TYPE(packed_in.scalar_type() == at::kFloat, op, ": packed must be float32, got ",
                   packed_in.scalar_type());
  TORCH_CHECK_VALUE(x_in.is_cpu(), op, ": x must be a CPU tensor (this op has only a CPU kernel)");
  TORCH_CHECK_VALUE(packed_in.is_cpu(), op, ": packed must be a CPU tensor, like x");
  at::Tensor bias;
  if (bias_in.has_value()) {
    bias = *bias_in;
    TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == N, op, ": bias must have shape (out_features,) = (", N,
                      "), got ", bias.sizes());
    TORCH_CHECK_TYPE(bias.scalar_type() == at::kFloat, op, ": bias must be float32, got ", bias.scalar_type());
    TORCH_CHECK_VALUE(bias.is_cpu(), op, ": bias must be a CPU tensor, like x");
    bias = bias.contiguous();
  }
  const at::Tensor x = x_in.contiguous(), packed = packed_in.contiguous();
  at::Tensor y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return bias.defined() ? y.copy_(bias.expand({M, N})) : y.zero_();
  const float* xp = x.const_data_ptr<float>();
  const float* wp = packed.const_data_ptr<float>();
  const float* bp = bias.defined() ? bias.const_data_ptr<float>() : nullptr;
  float* yp = y.mutable_data_ptr<float>();
  // threads split the output rows: ~64 KB of weight per task at least
  const int64_t grain = std::max<int64_t>(16, 16384 / (kblocks * KB));
  at::parallel_for(0, tiles, grain, [&](int64_t t0, int64_t t1) { cpu::skinny_linear(xp, M, K, wp, bp, N, yp, t0, t1); });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(redrafter, CPU, m) {
  REDRAFTER_IMPL_ALL(m, cpu);
  m.impl("skinny_linear", &skinny_linear_cpu);
}

}  // namespace redrafter
