// pybind11 test module: the CUDA kernels of csrc/cuda/*.cu compiled with g++ against the host shim
// (tests/shim/cuda_shim.h), called with numpy arrays as "device" memory. No torch headers, so it
// builds in seconds. Built and loaded by tests/emu/emu_build.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda/kernels.h"

namespace py = pybind11;
namespace rc = redrafter::cuda;

namespace negative {  // tests/emu/negative.cu
cudaError_t missing_sync(int32_t* out, int n);
cudaError_t divergent_barrier(int32_t* out, int n);
cudaError_t exit_before_barrier(int32_t* out, int n);
cudaError_t divergent_shuffle(int32_t* out, int n);
}  // namespace negative

namespace {

// Pointer to the data of a C-contiguous array whose items have sizeof(T) bytes.
template <typename T>
T* data(py::array& a, const char* name) {
  if (!(a.flags() & py::array::c_style)) throw std::invalid_argument(std::string(name) + " must be C-contiguous");
  if (a.itemsize() != static_cast<py::ssize_t>(sizeof(T)))
    throw std::invalid_argument(std::string(name) + ": wrong item size " + std::to_string(a.itemsize()));
  return static_cast<T*>(a.mutable_data());
}

void check(cudaError_t e, const char* op) {
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(op) + ": " + cudaGetErrorString(e) + ": " + redrafter_emu::emu_error());
  }
}

// Registers the buffer of `a` under `name` for the traffic report (no-op unless counting).
void region(const char* name, const py::array& a) {
  redrafter_emu::traffic_region(name, a.data(), static_cast<size_t>(a.nbytes()));
}

py::tuple traffic_report(const redrafter_emu::Traffic& t) {
  py::list out;
  for (const auto& l : t.launches) {
    py::dict d;
    d["name"] = l.name;
    d["grid"] = py::make_tuple(l.grid.x, l.grid.y, l.grid.z);
    d["block"] = py::make_tuple(l.block.x, l.block.y, l.block.z);
    d["smem"] = l.smem;
    d["blocks_total"] = l.blocks_total;
    d["blocks_run"] = l.blocks_run;
    py::dict rw, ww;
    const int widths[5] = {1, 2, 4, 8, 16};
    for (int i = 0; i < 5; ++i) {
      rw[py::int_(widths[i])] = l.read_by_width[i];
      ww[py::int_(widths[i])] = l.write_by_width[i];
    }
    d["read_by_width"] = rw;
    d["write_by_width"] = ww;
    py::dict rr, wr;
    for (size_t r = 0; r <= t.regions.size(); ++r) {
      const std::string name = r < t.regions.size() ? t.regions[r].name : std::string("(other)");
      if (l.region_read[r]) rr[py::str(name)] = l.region_read[r];
      if (l.region_write[r]) wr[py::str(name)] = l.region_write[r];
    }
    d["region_read"] = rr;
    d["region_write"] = wr;
    out.append(d);
  }
  py::dict sizes;
  for (const auto& r : t.regions) sizes[py::str(r.name)] = r.hi - r.lo;
  return py::make_tuple(out, sizes);
}

rc::IndexType index_type(const py::array& a) {
  if (a.dtype().kind() != 'i' || (a.itemsize() != 4 && a.itemsize() != 8))
    throw std::invalid_argument("index arrays must be int32 or int64");
  return a.itemsize() == 8 ? rc::IndexType::kInt64 : rc::IndexType::kInt32;
}

// float32 arrays, or uint16 arrays holding float16 (kind 1) / bfloat16 (kind 2) bits
rc::FloatType float_type(const py::array& a, int kind16) {
  if (a.itemsize() == 4) return rc::FloatType::kFloat32;
  if (a.itemsize() != 2 || (kind16 != 1 && kind16 != 2)) throw std::invalid_argument("bad float array / kind");
  return kind16 == 1 ? rc::FloatType::kFloat16 : rc::FloatType::kBFloat16;
}

}  // namespace

// ---- kv_compact_paged: self-contained, called once from the module body ----------------
// kv_pages: C-contiguous (n_layers, num_blocks, 2, H, block_size, D), slot = D * itemsize bytes;
// block_table int32 (B, max_blocks).
static void bind_kv_compact_paged(py::module_& m) {
  m.def("kv_compact_paged", [](py::array pages, py::array block_table, py::array cache_len, py::array path_nodes,
                               py::array accept_len) {
    const auto it = index_type(path_nodes);
    if (index_type(accept_len) != it) throw std::invalid_argument("path_nodes and accept_len: one index dtype");
    if (!(pages.flags() & py::array::c_style)) throw std::invalid_argument("kv_pages must be C-contiguous");
    if (pages.ndim() != 6 || block_table.ndim() != 2) throw std::invalid_argument("kv_pages / block_table rank");
    check(rc::kv_compact_paged(pages.mutable_data(), pages.shape(0), pages.shape(1), pages.shape(3), pages.shape(4),
                               pages.shape(5) * pages.itemsize(), data<int32_t>(block_table, "block_table"),
                               block_table.shape(0), block_table.shape(1), data<int32_t>(cache_len, "cache_len"),
                               path_nodes.mutable_data(), accept_len.mutable_data(), it, path_nodes.shape(1), nullptr),
          "kv_compact_paged");
  });
}

PYBIND11_MODULE(redrafter_emu, m) {
  bind_kv_compact_paged(m);
  m.def("set_seed", [](uint64_t seed) { redrafter_emu::set_seed(seed); });
  m.def("last_error", [] { return redrafter_emu::emu_error(); });
  // traffic counting: start (every `sample`-th block runs), run ops, stop -> (launches, region sizes)
  m.def("traffic_start", [](uint64_t sample) { redrafter_emu::traffic_start(sample); }, py::arg("sample") = 1);
  m.def("traffic_stop", [] { return traffic_report(redrafter_emu::traffic_stop()); });
  // verify_greedy's strategy: 0 by size, 1 per node, 2 lazy
  m.def("verify_greedy_set_strategy", [](int s) { rc::verify_greedy_set_strategy(s); });
  // verify_sample's one-pass filter: list slots per thread (-1 default, 0 off); general-path nodes
  m.def("verify_sample_set_list_slots", [](int s) { rc::verify_sample_set_list_slots(s); });
  m.def("verify_sample_general_nodes", [] { return rc::verify_sample_general_nodes(); });

  m.def("tree_mask", [](py::array parent, py::array num_nodes, bool packed, py::array out) {
    const int64_t B = parent.shape(0), N = parent.shape(1);
    check(rc::tree_mask(data<int32_t>(parent, "parent"), data<int32_t>(num_nodes, "num_nodes"), B, N, packed,
                        packed ? static_cast<void*>(data<int32_t>(out, "out")) : data<bool>(out, "out"), nullptr),
          "tree_mask");
  });

  m.def("build_trie", [](py::array beams, py::array token, py::array parent, py::array depth, py::array beam_node,
                         py::array num_nodes) {
    const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
    const auto it = index_type(beams);
    void* p = it == rc::IndexType::kInt64 ? static_cast<void*>(data<int64_t>(beams, "beams"))
                                           : static_cast<void*>(data<int32_t>(beams, "beams"));
    check(rc::build_trie(p, it, B, W, L, data<int32_t>(token, "token"), data<int32_t>(parent, "parent"),
                         data<int32_t>(depth, "depth"), data<int32_t>(beam_node, "beam_node"),
                         data<int32_t>(num_nodes, "num_nodes"), nullptr),
          "build_trie");
  });

  // ngram_lookup: tokens (B, S) and length (B,) of one index dtype (the launcher's common type)
  m.def("ngram_lookup", [](py::array tokens, py::array length, int64_t max_n, py::array drafts) {
    const auto it = index_type(tokens);
    if (index_type(length) != it) throw std::invalid_argument("tokens and length: one index dtype");
    if (tokens.ndim() != 2 || length.ndim() != 1 || drafts.ndim() != 2 || length.shape(0) != tokens.shape(0) ||
        drafts.shape(0) != tokens.shape(0))
      throw std::invalid_argument("ngram_lookup: shapes");
    if (!(tokens.flags() & py::array::c_style) || !(length.flags() & py::array::c_style))
      throw std::invalid_argument("tokens / length must be C-contiguous");
    for (auto [n, a] : {std::pair<const char*, py::array*>{"tokens", &tokens}, {"length", &length}, {"drafts", &drafts}})
      region(n, *a);
    check(rc::ngram_lookup(tokens.mutable_data(), length.mutable_data(), it, tokens.shape(0), tokens.shape(1), max_n,
                           drafts.shape(1), data<int32_t>(drafts, "drafts"), nullptr),
          "ngram_lookup");
  });

  m.def("verify_greedy", [](py::array logits, int kind16, py::array beams, py::array beam_node, py::array accept_len,
                            py::array best_beam, py::array path_nodes, py::array next_token) {
    const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
    const auto it = index_type(beams);
    if (index_type(beam_node) != it) throw std::invalid_argument("beams and beam_node: one index dtype");
    const auto ft = float_type(logits, kind16);
    py::array_t<uint64_t> ws(static_cast<py::ssize_t>(
        (rc::verify_greedy_workspace_bytes(B, logits.shape(1), logits.shape(2), W, ft) + 7) / 8));
    for (auto [n, a] : {std::pair<const char*, py::array*>{"logits", &logits}, {"beams", &beams},
                        {"beam_node", &beam_node}, {"workspace", &ws}, {"accept_len", &accept_len},
                        {"best_beam", &best_beam}, {"path_nodes", &path_nodes}, {"next_token", &next_token}})
      region(n, *a);
    check(rc::verify_greedy(logits.mutable_data(), ft, logits.shape(1), logits.shape(2), beams.mutable_data(),
                            beam_node.mutable_data(), it, B, W, L, data<int32_t>(accept_len, "accept_len"),
                            data<int32_t>(best_beam, "best_beam"), data<int32_t>(path_nodes, "path_nodes"),
                            data<int32_t>(next_token, "next_token"), ws.mutable_data(), nullptr),
          "verify_greedy");
  });

  // kv: any C-contiguous array of shape (n_layers, 2, B, H, S, D); slot = D * itemsize bytes
  m.def("kv_compact", [](py::array kv, py::array cache_len, py::array path_nodes, py::array accept_len) {
    const auto it = index_type(path_nodes);
    if (index_type(accept_len) != it) throw std::invalid_argument("path_nodes and accept_len: one index dtype");
    if (!(kv.flags() & py::array::c_style)) throw std::invalid_argument("kv must be C-contiguous");
    check(rc::kv_compact(kv.mutable_data(), kv.shape(0), kv.shape(2), kv.shape(3), kv.shape(4),
                         kv.shape(5) * kv.itemsize(), data<int32_t>(cache_len, "cache_len"), path_nodes.mutable_data(),
                         accept_len.mutable_data(), it, path_nodes.shape(1), nullptr),
          "kv_compact");
  });

#ifdef EMU_HAVE_BEAM_TOPK
  m.def("beam_topk_workspace_bytes",
        [](int64_t B, int64_t W, int64_t V) { return rc::beam_topk_workspace_bytes(B, W, V); });
  m.def("beam_topk", [](py::array logits, int kind16, py::array scores, py::array tokens, py::array state,
                        int64_t step, py::array scores_out, py::array tokens_out, py::array state_out,
                        py::array parent_out, py::array workspace) {
    const int64_t B = logits.shape(0), W = logits.shape(1), V = logits.shape(2), L = tokens.shape(2);
    const int64_t row_bytes = state.shape(2) * state.itemsize();
    if (reinterpret_cast<uintptr_t>(workspace.data()) % 16) throw std::invalid_argument("workspace alignment");
    for (auto [n, a] : {std::pair<const char*, py::array*>{"logits", &logits}, {"scores", &scores},
                        {"tokens", &tokens}, {"state", &state}, {"workspace", &workspace},
                        {"scores_out", &scores_out}, {"tokens_out", &tokens_out}, {"state_out", &state_out},
                        {"parent_out", &parent_out}})
      region(n, *a);
    check(rc::beam_topk(logits.mutable_data(), float_type(logits, kind16), data<float>(scores, "scores"),
                        tokens.mutable_data(), index_type(tokens), state.mutable_data(), row_bytes, B, W, V, L, step,
                        data<float>(scores_out, "scores_out"), data<int32_t>(tokens_out, "tokens_out"),
                        state_out.mutable_data(), data<int32_t>(parent_out, "parent_out"), workspace.mutable_data(),
                        nullptr),
          "beam_topk");
  });

#endif

  m.def("negative", [](const std::string& which, py::array out) {
    int32_t* o = data<int32_t>(out, "out");
    const int n = static_cast<int>(out.size());
    cudaError_t e = cudaErrorInvalidValue;
    if (which == "missing_sync") e = negative::missing_sync(o, n);
    if (which == "divergent_barrier") e = negative::divergent_barrier(o, n);
    if (which == "exit_before_barrier") e = negative::exit_before_barrier(o, n);
    if (which == "divergent_shuffle") e = negative::divergent_shuffle(o, n);
    check(e, which.c_str());
  });

  // verify_sample: workspace is a float64 array of at least B*V items (temperature > 0; greedy runs
  // with its own workspace)
  m.def("verify_sample", [](py::array logits, int kind16, py::array beams, py::array beam_node, py::array accept_u,
                            py::array sample_u, double temperature, int64_t top_k, double top_p, py::array accept_len,
                            py::array best_beam, py::array path_nodes, py::array next_token, py::array workspace) {
    const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2), V = logits.shape(2);
    const auto it = index_type(beams);
    if (index_type(beam_node) != it) throw std::invalid_argument("beams and beam_node: one index dtype");
    const auto ft = float_type(logits, kind16);
    py::array_t<uint64_t> greedy_ws(static_cast<py::ssize_t>(
        (rc::verify_sample_workspace_bytes(B, logits.shape(1), V, W, ft, 0.0) + 7) / 8));
    py::array ws = temperature == 0.0 ? static_cast<py::array>(greedy_ws) : workspace;
    if (temperature != 0.0 && static_cast<size_t>(workspace.nbytes()) <
                                  rc::verify_sample_workspace_bytes(B, logits.shape(1), V, W, ft, temperature))
      throw std::invalid_argument("workspace too small");
    for (auto [n, a] : {std::pair<const char*, py::array*>{"logits", &logits}, {"beams", &beams},
                        {"beam_node", &beam_node}, {"accept_u", &accept_u}, {"sample_u", &sample_u},
                        {"workspace", &ws}, {"accept_len", &accept_len}, {"best_beam", &best_beam},
                        {"path_nodes", &path_nodes}, {"next_token", &next_token}})
      region(n, *a);
    check(rc::verify_sample(logits.mutable_data(), ft, logits.shape(1), V,
                            beams.mutable_data(), beam_node.mutable_data(), it, B, W, L,
                            data<float>(accept_u, "accept_u"), data<float>(sample_u, "sample_u"), temperature, top_k,
                            top_p, data<int32_t>(accept_len, "accept_len"), data<int32_t>(best_beam, "best_beam"),
                            data<int32_t>(path_nodes, "path_nodes"), data<int32_t>(next_token, "next_token"),
                            ws.mutable_data(), nullptr),
          "verify_sample");
  });
}
