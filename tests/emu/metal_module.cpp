// pybind11 test module: the Metal kernels of csrc/metal/*.metal, rewritten by tests/emu/metal_build.py
// and compiled with g++ against the host shim (tests/shim/metal_shim.h). numpy arrays stand for
// MTLBuffers; a dispatch names a kernel by its host name and binds buffers by index, like
// csrc/metal/dispatch.cpp does with MLX's command encoder. Built by tests/emu/metal_build.py.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "metal_shim.h"  // after the std / pybind11 headers: it defines MSL's qualifier macros
#include "params.h"

namespace py = pybind11;

PYBIND11_MODULE(redrafter_metal_emu, m) {
  m.def("set_seed", [](uint64_t seed) { redrafter_emu::set_seed(seed); });
  m.def("kernels", [] {
    std::vector<std::string> names;
    for (auto& entry : mtl_emu::registry()) names.push_back(entry.first);
    return names;
  });

  // buffers[k]: a C-contiguous numpy array bound at index k, or None (unbound)
  m.def("dispatch", [](const std::string& name, py::list buffers, unsigned groups, unsigned threads) {
    mtl_emu::Bindings b;
    if (buffers.size() > mtl_emu::Bindings::kMax) throw std::invalid_argument("too many buffers");
    for (size_t k = 0; k < buffers.size(); ++k) {
      if (buffers[k].is_none()) continue;
      py::array a = buffers[k].cast<py::array>();
      if (!(a.flags() & py::array::c_style)) {
        throw std::invalid_argument("buffer " + std::to_string(k) + " must be C-contiguous");
      }
      b.buf[k] = a.mutable_data();
    }
    const std::string err = mtl_emu::dispatch(name, b, groups, threads);
    if (!err.empty()) throw std::runtime_error(err);
  });

  // field offsets and sizes of the parameter blocks (params.h), so that Python packs them exactly
  py::dict layouts;
  auto layout = [&](const char* name, size_t size, std::initializer_list<std::pair<const char*, size_t>> fields) {
    py::dict d;
    for (const auto& [field, offset] : fields) d[field] = offset;
    d["__size__"] = size;
    layouts[name] = d;
  };
#define RD_FIELD(S, f) {#f, offsetof(S, f)}
  layout("TreeMaskParams", sizeof(TreeMaskParams), {RD_FIELD(TreeMaskParams, N), RD_FIELD(TreeMaskParams, words)});
  layout("BuildTrieParams", sizeof(BuildTrieParams),
         {RD_FIELD(BuildTrieParams, W), RD_FIELD(BuildTrieParams, L), RD_FIELD(BuildTrieParams, N)});
  layout("NgramLookupParams", sizeof(NgramLookupParams),
         {RD_FIELD(NgramLookupParams, S), RD_FIELD(NgramLookupParams, max_n), RD_FIELD(NgramLookupParams, m)});
  layout("BeamTopkParams", sizeof(BeamTopkParams),
         {RD_FIELD(BeamTopkParams, W), RD_FIELD(BeamTopkParams, V), RD_FIELD(BeamTopkParams, L),
          RD_FIELD(BeamTopkParams, step), RD_FIELD(BeamTopkParams, C), RD_FIELD(BeamTopkParams, state_units)});
  layout("VerifyParams", sizeof(VerifyParams),
         {RD_FIELD(VerifyParams, n_logit_rows), RD_FIELD(VerifyParams, V), RD_FIELD(VerifyParams, W),
          RD_FIELD(VerifyParams, L), RD_FIELD(VerifyParams, inv_temperature), RD_FIELD(VerifyParams, top_k),
          RD_FIELD(VerifyParams, top_p)});
  layout("KvCompactParams", sizeof(KvCompactParams),
         {RD_FIELD(KvCompactParams, units), RD_FIELD(KvCompactParams, B), RD_FIELD(KvCompactParams, H),
          RD_FIELD(KvCompactParams, S), RD_FIELD(KvCompactParams, vecs), RD_FIELD(KvCompactParams, L)});
#undef RD_FIELD
  m.attr("params_layout") = layouts;
}
