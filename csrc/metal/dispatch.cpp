// Metal side of the MLX primitives (declared in csrc/metal/dispatch.h): allocates the outputs and
// encodes the kernels of csrc/metal/*.metal on the primitive's stream. Buffer indices, parameter
// blocks (csrc/metal/params.h) and grid / threadgroup sizes follow the comment block at the top of
// each .metal file; tests/emu/metal_ops.py does the same over the CPU emulator (keep them in step).
// The kernels come from redrafter_ext_mlx.metallib, installed next to the extension module that
// contains this file. macOS only.
//
// UNTESTED: written against MLX 0.32's extension API without Apple hardware; the kernels
// themselves are tested on the CPU through the emulator (tests/test_metal_emulated.py).
#include "metal/dispatch.h"

#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "metal/params.h"
#include "mlx/allocator.h"
#include "mlx/backend/metal/device.h"

namespace redrafter::metal {
namespace {

constexpr const char* kLibName = "redrafter_ext_mlx";

// <directory of the binary holding this code>/redrafter_ext_mlx.metallib
const std::string& metallib_path() {
  static const std::string path = [] {
    Dl_info info;
    if (!dladdr(reinterpret_cast<void*>(&metallib_path), &info) || !info.dli_fname) {
      throw std::runtime_error("redrafter_ext: cannot locate the MLX extension module (dladdr failed)");
    }
    return (std::filesystem::path(info.dli_fname).parent_path() / (std::string(kLibName) + ".metallib")).string();
  }();
  return path;
}

std::string dtype_name(mx::Dtype t, const char* what) {
  if (t == mx::float32) return "float32";
  if (t == mx::float16) return "float16";
  if (t == mx::bfloat16) return "bfloat16";
  throw std::invalid_argument(std::string("redrafter_ext (Metal): ") + what + " must be float32, float16 or bfloat16");
}

void alloc(mx::array& a) { a.set_data(mx::allocator::malloc(a.nbytes())); }

// A scratch buffer that lives until the command buffer completes.
mx::array temporary(mx::Shape shape, mx::Dtype dtype, mx::metal::CommandEncoder& enc) {
  mx::array t(std::move(shape), dtype, nullptr, {});
  alloc(t);
  enc.add_temporary(t);
  return t;
}

// One kernel launch: pipeline, buffers by index, dispatch_threadgroups.
class Launch {
 public:
  Launch(mx::Stream s, const std::string& kernel) : enc_(mx::metal::get_command_encoder(s)) {
    auto& d = mx::metal::device(s.device);
    auto* lib = d.get_library(kLibName, metallib_path());
    pipeline_ = d.get_kernel(kernel, lib);
    enc_.set_compute_pipeline_state(pipeline_);
  }
  // the largest threadgroup the pipeline allows, as a multiple of 32 (the kernels' simdgroups)
  unsigned max_threads() const {
    const auto m = static_cast<unsigned>(pipeline_->maxTotalThreadsPerThreadgroup());
    return std::max(32u, m / 32u * 32u);
  }
  // zero-size arrays may have no buffer: bind `fallback` there (the kernel never reads it)
  Launch& in(const mx::array& a, int idx, const mx::array* fallback = nullptr) {
    enc_.set_input_array(a.size() == 0 && fallback ? *fallback : a, idx);
    return *this;
  }
  Launch& out(mx::array& a, int idx) {
    enc_.set_output_array(a, idx);
    return *this;
  }
  template <typename P>
  Launch& bytes(const P& p, int idx) {
    enc_.set_bytes(p, idx);
    return *this;
  }
  void run(size_t groups, unsigned threads) {
    threads = std::min(threads, max_threads());
    enc_.dispatch_threadgroups(MTL::Size(groups, 1, 1), MTL::Size(threads, 1, 1));
  }
  mx::metal::CommandEncoder& encoder() { return enc_; }

 private:
  mx::metal::CommandEncoder& enc_;
  MTL::ComputePipelineState* pipeline_ = nullptr;
};

unsigned round32(int64_t n, unsigned cap = 1024) {
  const int64_t r = (n + 31) / 32 * 32;
  return static_cast<unsigned>(std::max<int64_t>(32, std::min<int64_t>(cap, r)));
}

int checked_int(int64_t v, const char* what) {
  if (v > 0x7fffffff) throw std::invalid_argument(std::string("redrafter_ext (Metal): ") + what + " exceeds 2^31 - 1");
  return static_cast<int>(v);
}

// Largest vector unit (16, 8, 4, 2, 1 bytes) dividing both the row size and the data address.
int vector_bytes(const mx::array& a, int64_t row_bytes) {
  const auto addr = reinterpret_cast<uintptr_t>(a.data<char>());
  for (int n : {16, 8, 4, 2}) {
    if (row_bytes % n == 0 && addr % n == 0) return n;
  }
  return 1;
}

// dst = src (same size, contiguous) with kv_copy_<n>.
void copy_into(const mx::array& src, mx::array& dst, mx::Stream s) {
  const int64_t bytes = static_cast<int64_t>(src.nbytes());
  const int n = std::min(vector_bytes(src, bytes), vector_bytes(dst, bytes));
  const auto count = static_cast<uint32_t>(checked_int(bytes / n, "kv_compact: cache bytes / vector size"));
  Launch l(s, "kv_copy_" + std::to_string(n));
  l.in(src, 0).out(dst, 1).bytes(count, 2);
  l.run(std::max<size_t>(1, std::min<size_t>(65535, (count + 255) / 256)), 256);
}

}  // namespace

void beam_topk(const Arrays& in, Arrays& out, int step, mx::Stream s) {
  const auto& logits = in[0];
  const auto& scores = in[1];
  const auto& tokens = in[2];
  const auto& state = in[3];
  for (auto& o : out) alloc(o);
  const int64_t B = logits.shape(0), W = logits.shape(1), V = logits.shape(2);
  const int64_t L = tokens.shape(2), D = state.shape(2);
  if (B == 0 || W == 0) return;
  BeamTopkParams p;
  p.W = checked_int(W, "beam_topk: W");
  p.V = checked_int(V, "beam_topk: V");
  p.L = checked_int(L, "beam_topk: L");
  p.step = step;
  p.C = static_cast<int>(std::min(W, V));
  p.state_units = checked_int(D * static_cast<int64_t>(state.itemsize()) / 2, "beam_topk: state row");
  auto& enc = mx::metal::get_command_encoder(s);
  auto row_f = temporary({static_cast<int>(B * W), static_cast<int>(W)}, mx::float32, enc);
  auto row_i = temporary({static_cast<int>(B * W), static_cast<int>(W)}, mx::int32, enc);
  auto order = temporary({static_cast<int>(B), static_cast<int>(W)}, mx::int32, enc);
  {
    Launch l(s, "beam_topk_rows_" + dtype_name(logits.dtype(), "logits"));
    l.in(logits, 0).in(scores, 1).out(row_f, 2).out(row_i, 3).bytes(p, 4);
    l.run(static_cast<size_t>(B * W), round32((V + 7) / 8, 256));
  }
  Launch l(s, "beam_topk_merge");
  l.in(row_f, 0).in(row_i, 1).in(tokens, 2).in(state, 3, &tokens);
  l.out(out[0], 4).out(out[1], 5).out(out[2], 6).out(out[3], 7).out(order, 8).bytes(p, 9);
  l.run(static_cast<size_t>(B), round32(W * p.C, 256));
}

void build_trie(const Arrays& in, Arrays& out, mx::Stream s) {
  const auto& beams = in[0];
  for (auto& o : out) alloc(o);
  const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
  if (B == 0) return;
  BuildTrieParams p;
  p.W = checked_int(W, "build_trie: W");
  p.L = checked_int(L, "build_trie: L");
  p.N = checked_int(1 + W * (L - 1), "build_trie: N");
  Launch l(s, "build_trie");
  l.in(beams, 0).out(out[0], 1).out(out[1], 2).out(out[2], 3).out(out[3], 4).out(out[4], 5).bytes(p, 6);
  l.run(static_cast<size_t>(B), round32(W * (L - 1)));
}

void ngram_lookup(const Arrays& in, Arrays& out, int max_n, int m, mx::Stream s) {
  const auto& tokens = in[0];
  const auto& length = in[1];
  alloc(out[0]);
  const int64_t B = tokens.shape(0), S = tokens.shape(1);
  if (B == 0) return;
  NgramLookupParams p;
  p.S = checked_int(S, "ngram_lookup: S");
  p.max_n = max_n;
  p.m = m;
  Launch l(s, "ngram_lookup");
  l.in(tokens, 0).in(length, 1).out(out[0], 2).bytes(p, 3);
  l.run(static_cast<size_t>(B), round32(S, 256));
}

void tree_mask(const Arrays& in, Arrays& out, bool packed, mx::Stream s) {
  const auto& parent = in[0];
  const auto& num_nodes = in[1];
  alloc(out[0]);
  const int64_t B = parent.shape(0), N = parent.shape(1);
  if (B == 0 || N == 0) return;
  TreeMaskParams p;
  p.N = checked_int(N, "tree_mask: N");
  p.words = static_cast<int>((N + 31) / 32);
  Launch l(s, packed ? "tree_mask_packed" : "tree_mask_bool");
  l.in(parent, 0).in(num_nodes, 1).out(out[0], 2).bytes(p, 3);
  l.run(static_cast<size_t>(B), round32(N, 256));
}

namespace {

VerifyParams verify_params(const Arrays& in, float temperature, int top_k, float top_p) {
  VerifyParams p;
  p.n_logit_rows = checked_int(in[0].shape(1), "verify: logits rows");
  p.V = checked_int(in[0].shape(2), "verify: V");
  p.W = checked_int(in[1].shape(1), "verify: W");
  p.L = checked_int(in[1].shape(2), "verify: L");
  p.inv_temperature = temperature > 0.0f ? 1.0f / temperature : 0.0f;
  p.top_k = top_k;
  p.top_p = top_p;
  return p;
}

void encode_verify_greedy(const Arrays& in, Arrays& out, mx::Stream s) {
  const int64_t B = in[1].shape(0), W = in[1].shape(1);
  const VerifyParams p = verify_params(in, 0.0f, 0, 1.0f);
  Launch l(s, "verify_greedy_" + dtype_name(in[0].dtype(), "logits"));
  l.in(in[0], 0).in(in[1], 1).in(in[2], 2);
  l.out(out[0], 3).out(out[1], 4).out(out[2], 5).out(out[3], 6).bytes(p, 7);
  l.run(static_cast<size_t>(B), static_cast<unsigned>(32 * std::min<int64_t>(W, 32)));
}

}  // namespace

void verify_greedy(const Arrays& in, Arrays& out, mx::Stream s) {
  for (auto& o : out) alloc(o);
  if (in[1].shape(0) == 0) return;
  encode_verify_greedy(in, out, s);
}

void verify_sample(const Arrays& in, Arrays& out, float temperature, int top_k, float top_p, mx::Stream s) {
  for (auto& o : out) alloc(o);
  const int64_t B = in[1].shape(0), V = in[0].shape(2);
  if (B == 0) return;
  if (temperature == 0.0f) {  // greedy exactly; the uniforms are unused
    encode_verify_greedy(in, out, s);
    return;
  }
  const VerifyParams p = verify_params(in, temperature, top_k, top_p);
  auto& enc = mx::metal::get_command_encoder(s);
  auto probs = temporary({static_cast<int>(B), static_cast<int>(V)}, mx::float32, enc);
  Launch l(s, "verify_sample_" + dtype_name(in[0].dtype(), "logits"));
  l.in(in[0], 0).in(in[1], 1).in(in[2], 2).in(in[3], 3, &in[4]).in(in[4], 4);
  l.out(out[0], 5).out(out[1], 6).out(out[2], 7).out(out[3], 8).out(probs, 9).bytes(p, 10);
  l.run(static_cast<size_t>(B), round32((V + 7) / 8));
}

void kv_compact(const Arrays& in, Arrays& out, mx::Stream s) {
  const auto& kv = in[0];
  const auto& path_nodes = in[2];
  const auto& accept_len = in[3];
  // in place when MLX lets us reuse the input buffers, else on fresh copies
  for (int k = 0; k < 2; ++k) {
    if (in[k].is_donatable()) {
      out[k].copy_shared_buffer(in[k]);
    } else {
      alloc(out[k]);
      if (in[k].size() > 0) copy_into(in[k], out[k], s);
    }
  }
  const int64_t n_layers = kv.shape(0), B = kv.shape(2), H = kv.shape(3), S = kv.shape(4), D = kv.shape(5);
  const int64_t L = path_nodes.shape(1);
  if (B == 0 || kv.size() == 0) return;
  const int64_t slot = D * static_cast<int64_t>(kv.itemsize());
  const int vec = vector_bytes(out[0], slot);
  KvCompactParams p;
  p.units = checked_int(n_layers * 2 * B * H, "kv_compact: n_layers * 2 * B * H");
  p.B = checked_int(B, "kv_compact: B");
  p.H = checked_int(H, "kv_compact: H");
  p.S = checked_int(S, "kv_compact: S");
  p.vecs = checked_int(slot / vec, "kv_compact: slot size");
  p.L = checked_int(L, "kv_compact: L");
  {
    Launch l(s, "kv_compact_" + std::to_string(vec));
    // cache_len is only read here, but bound as an output so that MLX's encoder (concurrent
    // dispatch, barriers only before reads of earlier outputs) puts a barrier before kv_compact_advance
    // writes it: no write-after-read race
    l.out(out[0], 0).out(out[1], 1).in(path_nodes, 2).in(accept_len, 3).bytes(p, 4);
    const int64_t total = int64_t(p.units) * p.vecs;
    l.run(static_cast<size_t>(std::max<int64_t>(1, std::min<int64_t>(65535, (total + 255) / 256))), 256);
  }
  Launch l(s, "kv_compact_advance");
  l.out(out[1], 0).in(path_nodes, 1).in(accept_len, 2).bytes(p, 3);
  l.run(static_cast<size_t>((B + 255) / 256), 256);
}

}  // namespace redrafter::metal
