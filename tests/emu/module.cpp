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

// ---- kv_compact_paged (issue 8): self-contained, called once from the module body ----------------
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
  bind_kv_compact_paged(m);  // issue 8
  m.def("set_seed", [](uint64_t seed) { redrafter_emu::set_seed(seed); });
  m.def("last_error", [] { return redrafter_emu::emu_error(); });

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

  m.def("verify_greedy", [](py::array logits, int kind16, py::array beams, py::array beam_node, py::array accept_len,
                            py::array best_beam, py::array path_nodes, py::array next_token) {
    const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
    const auto it = index_type(beams);
    if (index_type(beam_node) != it) throw std::invalid_argument("beams and beam_node: one index dtype");
    check(rc::verify_greedy(logits.mutable_data(), float_type(logits, kind16), logits.shape(1), logits.shape(2),
                            beams.mutable_data(), beam_node.mutable_data(), it, B, W, L,
                            data<int32_t>(accept_len, "accept_len"), data<int32_t>(best_beam, "best_beam"),
                            data<int32_t>(path_nodes, "path_nodes"), data<int32_t>(next_token, "next_token"), nullptr),
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

  // verify_sample: workspace is a float64 array of at least B*V items
  m.def("verify_sample", [](py::array logits, int kind16, py::array beams, py::array beam_node, py::array accept_u,
                            py::array sample_u, double temperature, int64_t top_k, double top_p, py::array accept_len,
                            py::array best_beam, py::array path_nodes, py::array next_token, py::array workspace) {
    const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2), V = logits.shape(2);
    const auto it = index_type(beams);
    if (index_type(beam_node) != it) throw std::invalid_argument("beams and beam_node: one index dtype");
    if (workspace.size() < B * V) throw std::invalid_argument("workspace too small");
    check(rc::verify_sample(logits.mutable_data(), float_type(logits, kind16), logits.shape(1), V,
                            beams.mutable_data(), beam_node.mutable_data(), it, B, W, L,
                            data<float>(accept_u, "accept_u"), data<float>(sample_u, "sample_u"), temperature, top_k,
                            top_p, data<int32_t>(accept_len, "accept_len"), data<int32_t>(best_beam, "best_beam"),
                            data<int32_t>(path_nodes, "path_nodes"), data<int32_t>(next_token, "next_token"),
                            data<double>(workspace, "workspace"), nullptr),
          "verify_sample");
  });
}
