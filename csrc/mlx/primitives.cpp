// Graph construction, CPU evaluation and GPU dispatch of the MLX primitives (redrafter_mlx.h).
//
// eval_cpu runs on the thread that schedules the graph: it allocates the outputs and enqueues one
// task on the stream's CPU command encoder, which calls the csrc/cpu kernel over all rows when the
// inputs are ready. So the ops are lazy and asynchronous like MLX's own. Values are unknown when
// the graph is built, so each task first clamps the values that index memory (node ids, lengths,
// draft tokens) into range, or drops an invalid kv_compact row: results for invalid inputs are
// unspecified but memory-safe (the torch ops raise instead).
#include "redrafter_mlx.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "cpu/kernels.h"
#include "cpu/types.h"
#include "mlx/allocator.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/ops.h"

#ifdef REDRAFTER_MLX_METAL
#include "metal/dispatch.h"
#endif

namespace redrafter::mlx_ext {
namespace {

// ---- graph-time checks (metadata only) ----

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string(op) + ": " + msg);
}

std::string shape_str(const mx::array& a) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < static_cast<int>(a.ndim()); ++i) os << (i ? ", " : "") << a.shape(i);
  os << (a.ndim() == 1 ? ",)" : ")");
  return os.str();
}

void check_rank(const char* op, const char* name, const mx::array& a, int ndim, const char* dims) {
  if (static_cast<int>(a.ndim()) != ndim) {
    fail(op, std::string(name) + " must have " + std::to_string(ndim) + " dims (" + dims + "), got shape " +
                 shape_str(a));
  }
}

bool is_float(mx::Dtype t) { return t == mx::float32 || t == mx::float16 || t == mx::bfloat16; }

void check_float(const char* op, const char* name, const mx::array& a) {
  if (!is_float(a.dtype())) fail(op, std::string(name) + " must be float32, float16 or bfloat16");
}

void check_dtype(const char* op, const char* name, const mx::array& a, mx::Dtype t, const char* tname) {
  if (a.dtype() != t) fail(op, std::string(name) + " must have dtype " + tname);
}

void check_dim(const char* op, const char* name, const mx::array& a, int axis, int expected, const char* what) {
  if (a.shape(axis) != expected) {
    fail(op, std::string(name) + " dim " + std::to_string(axis) + " must be " + what + " = " +
                 std::to_string(expected) + ", got shape " + shape_str(a));
  }
}

// The kernels take dense row-major buffers. An evaluated row-contiguous input is used as it is;
// anything else (lazy, strided, broadcast) goes through MLX's contiguous op, which shares the
// buffer when the result is already row-contiguous and copies otherwise.
mx::array dense(const mx::array& a, mx::Stream s) {
  if (a.is_available() && a.flags().row_contiguous && a.data_size() == a.size()) return a;
  return mx::contiguous(a, false, s);
}

// ---- eval helpers ----

void alloc(mx::array& a) { a.set_data(mx::allocator::malloc(a.nbytes())); }

// Calls f with a null pointer of the kernels' element type for a float32/float16/bfloat16 array.
template <typename F>
void dispatch_float(mx::Dtype t, F&& f) {
  if (t == mx::float32) {
    f(static_cast<float*>(nullptr));
  } else if (t == mx::float16) {
    f(static_cast<cpu::Half*>(nullptr));
  } else if (t == mx::bfloat16) {
    f(static_cast<cpu::BFloat16*>(nullptr));
  } else {
    throw std::invalid_argument("redrafter_ext.mlx: unsupported float dtype");
  }
}

// Registers the arrays of one evaluation with the CPU encoder of the primitive's stream.
mx::cpu::CommandEncoder& encoder_for(mx::Stream s, const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  auto& enc = mx::cpu::get_command_encoder(s);
  for (const auto& a : in) enc.set_input_array(a);
  for (auto& a : out) enc.set_output_array(a);
  return enc;
}

template <typename T>
T* ptr(const mx::array& a) {
  return const_cast<T*>(a.data<T>());
}

[[maybe_unused]] [[noreturn]] void no_gpu(const char* op) {
  throw std::runtime_error(std::string("redrafter_ext.mlx.") + op +
                           ": no GPU implementation in this build (the Metal kernels are compiled only on "
                           "macOS against an MLX built with Metal); run it on the CPU: stream=mx.cpu");
}

int clamp_index(int32_t v, int32_t n) { return v < 0 ? 0 : (v >= n ? n - 1 : v); }

}  // namespace

// ---- transforms: not supported ----

std::vector<mx::array> Op::jvp(const std::vector<mx::array>&, const std::vector<mx::array>&, const std::vector<int>&) {
  throw std::invalid_argument(std::string("redrafter_ext.mlx: ") + name() + " does not support jvp (no gradients)");
}
std::vector<mx::array> Op::vjp(const std::vector<mx::array>&, const std::vector<mx::array>&, const std::vector<int>&,
                               const std::vector<mx::array>&) {
  throw std::invalid_argument(std::string("redrafter_ext.mlx: ") + name() + " does not support vjp (no gradients)");
}
std::pair<std::vector<mx::array>, std::vector<int>> Op::vmap(const std::vector<mx::array>&, const std::vector<int>&) {
  throw std::invalid_argument(std::string("redrafter_ext.mlx: ") + name() +
                              " does not support vmap (the batch axis B is explicit: stack rows into it)");
}

// =============================================================================================
// beam_topk

std::vector<mx::array> beam_topk(const mx::array& logits, const mx::array& scores, const mx::array& tokens,
                                 const mx::array& state, int step, mx::StreamOrDevice s) {
  const char* op = "beam_topk";
  check_rank(op, "logits", logits, 3, "B, W, V");
  check_float(op, "logits", logits);
  const int B = logits.shape(0), W = logits.shape(1), V = logits.shape(2);
  if (W < 1 || V < 1) fail(op, "logits must have W >= 1 and V >= 1, got shape " + shape_str(logits));
  check_rank(op, "scores", scores, 2, "B, W");
  check_dtype(op, "scores", scores, mx::float32, "float32");
  check_dim(op, "scores", scores, 0, B, "B");
  check_dim(op, "scores", scores, 1, W, "W");
  check_rank(op, "tokens", tokens, 3, "B, W, L");
  check_dtype(op, "tokens", tokens, mx::int32, "int32");
  check_dim(op, "tokens", tokens, 0, B, "B");
  check_dim(op, "tokens", tokens, 1, W, "W");
  check_rank(op, "state", state, 3, "B, W, D");
  check_float(op, "state", state);
  check_dim(op, "state", state, 0, B, "B");
  check_dim(op, "state", state, 1, W, "W");
  const int L = tokens.shape(2);
  if (step < 1 || step >= L) fail(op, "step must be in [1, L) with L=" + std::to_string(L));
  auto st = mx::to_stream(s);
  return mx::array::make_arrays({{B, W}, {B, W, L}, state.shape(), {B, W}},
                                {mx::float32, mx::int32, state.dtype(), mx::int32},
                                std::make_shared<BeamTopk>(st, step),
                                {dense(logits, st), dense(scores, st), dense(tokens, st), dense(state, st)});
}

std::vector<mx::Shape> BeamTopk::output_shapes(const std::vector<mx::array>& in) {
  const auto& l = in[0];
  return {{l.shape(0), l.shape(1)}, in[2].shape(), in[3].shape(), {l.shape(0), l.shape(1)}};
}

void BeamTopk::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const auto &logits = in[0], &scores = in[1], &tokens = in[2], &state = in[3];
  const int64_t B = logits.shape(0), W = logits.shape(1), V = logits.shape(2), L = tokens.shape(2);
  const int64_t row_bytes = state.shape(2) * static_cast<int64_t>(state.itemsize());
  auto& enc = encoder_for(stream(), in, out);
  dispatch_float(logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    enc.dispatch([x = ptr<T>(logits), s = ptr<float>(scores), t = ptr<int32_t>(tokens), st = ptr<uint8_t>(state),
                  so = ptr<float>(out[0]), to = ptr<int32_t>(out[1]), sto = ptr<uint8_t>(out[2]),
                  po = ptr<int32_t>(out[3]), B, W, V, L, row_bytes, step = int64_t{step_}]() {
      // working space of the two phases: each row's sorted candidates, their count, merge heads
      const int64_t S = cpu::beam_topk_stride(W);
      std::vector<float> cand_score(B * W * S);
      std::vector<int32_t> cand_token(B * W * S), cand_count(B * W), heads(B * W);
      cpu::beam_topk_rows<T>(x, s, W, V, cand_score.data(), cand_token.data(), cand_count.data(), 0, B * W);
      cpu::beam_topk_merge<int32_t>(cand_score.data(), cand_token.data(), cand_count.data(), t, st, W, V, L, step,
                                    row_bytes, so, to, sto, po, heads.data(), 0, B);
    });
  });
}

void BeamTopk::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::beam_topk(in, out, step_, stream());
#else
  no_gpu("beam_topk");
#endif
}

// =============================================================================================
// build_trie

std::vector<mx::array> build_trie(const mx::array& beams, mx::StreamOrDevice s) {
  const char* op = "build_trie";
  check_rank(op, "beams", beams, 3, "B, W, L");
  check_dtype(op, "beams", beams, mx::int32, "int32");
  const int B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
  if (W < 1 || L < 1) fail(op, "beams must have W >= 1 and L >= 1, got shape " + shape_str(beams));
  const int N = 1 + W * (L - 1);
  auto st = mx::to_stream(s);
  return mx::array::make_arrays({{B, N}, {B, N}, {B, N}, {B, W, L}, {B}},
                                {mx::int32, mx::int32, mx::int32, mx::int32, mx::int32},
                                std::make_shared<BuildTrie>(st), {dense(beams, st)});
}

std::vector<mx::Shape> BuildTrie::output_shapes(const std::vector<mx::array>& in) {
  const int B = in[0].shape(0), W = in[0].shape(1), L = in[0].shape(2), N = 1 + W * (L - 1);
  return {{B, N}, {B, N}, {B, N}, {B, W, L}, {B}};
}

void BuildTrie::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const auto& beams = in[0];
  const int64_t B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
  // token ids are only compared and copied: no value can index memory
  encoder_for(stream(), in, out)
      .dispatch([b = ptr<int32_t>(beams), tok = ptr<int32_t>(out[0]), par = ptr<int32_t>(out[1]),
                 dep = ptr<int32_t>(out[2]), bn = ptr<int32_t>(out[3]), nn = ptr<int32_t>(out[4]), B, W, L]() {
        cpu::build_trie<int32_t>(b, W, L, tok, par, dep, bn, nn, 0, B);
      });
}

void BuildTrie::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::build_trie(in, out, stream());
#else
  no_gpu("build_trie");
#endif
}

// =============================================================================================
// ngram_lookup

mx::array ngram_lookup(const mx::array& tokens, const mx::array& length, int max_n, int m, mx::StreamOrDevice s) {
  const char* op = "ngram_lookup";
  check_rank(op, "tokens", tokens, 2, "B, S");
  check_dtype(op, "tokens", tokens, mx::int32, "int32");
  const int B = tokens.shape(0), S = tokens.shape(1);
  if (S < 1) fail(op, "tokens must have S >= 1 columns, got shape " + shape_str(tokens));
  check_rank(op, "length", length, 1, "B");
  check_dtype(op, "length", length, mx::int32, "int32");
  check_dim(op, "length", length, 0, B, "B");
  // the Python wrappers' bound (NGRAM_MAX), as the torch launcher's
  if (max_n < 1 || max_n >= 65536) fail(op, "max_n must be an int in [1, 65536), got " + std::to_string(max_n));
  if (m < 1 || m >= 65536) fail(op, "m must be an int in [1, 65536), got " + std::to_string(m));
  auto st = mx::to_stream(s);
  return mx::array({B, m}, mx::int32, std::make_shared<NgramLookup>(st, max_n, m),
                   {dense(tokens, st), dense(length, st)});
}

std::vector<mx::Shape> NgramLookup::output_shapes(const std::vector<mx::array>& in) {
  return {{in[0].shape(0), m_}};
}

void NgramLookup::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const int64_t B = in[0].shape(0), S = in[0].shape(1);
  // token ids are only compared and copied; the kernel clamps a length outside [0, S] into it
  encoder_for(stream(), in, out)
      .dispatch([t = ptr<int32_t>(in[0]), len = ptr<int32_t>(in[1]), d = ptr<int32_t>(out[0]), B, S,
                 max_n = int64_t{max_n_}, m = int64_t{m_}]() { cpu::ngram_lookup<int32_t>(t, len, S, max_n, m, d, 0, B); });
}

void NgramLookup::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::ngram_lookup(in, out, max_n_, m_, stream());
#else
  no_gpu("ngram_lookup");
#endif
}

// =============================================================================================
// tree_mask

mx::array tree_mask(const mx::array& node_parent, const mx::array& num_nodes, bool packed, mx::StreamOrDevice s) {
  const char* op = "tree_mask";
  check_rank(op, "node_parent", node_parent, 2, "B, N");
  check_dtype(op, "node_parent", node_parent, mx::int32, "int32");
  const int B = node_parent.shape(0), N = node_parent.shape(1);
  if (N < 1) fail(op, "node_parent must have N >= 1 nodes, got shape " + shape_str(node_parent));
  check_rank(op, "num_nodes", num_nodes, 1, "B");
  check_dtype(op, "num_nodes", num_nodes, mx::int32, "int32");
  check_dim(op, "num_nodes", num_nodes, 0, B, "B");
  auto st = mx::to_stream(s);
  mx::Shape shape = packed ? mx::Shape{B, N, (N + 31) / 32} : mx::Shape{B, N, N};
  return mx::array(std::move(shape), packed ? mx::int32 : mx::bool_, std::make_shared<TreeMask>(st, packed),
                   {dense(node_parent, st), dense(num_nodes, st)});
}

std::vector<mx::Shape> TreeMask::output_shapes(const std::vector<mx::array>& in) {
  const int B = in[0].shape(0), N = in[0].shape(1);
  return {packed_ ? mx::Shape{B, N, (N + 31) / 32} : mx::Shape{B, N, N}};
}

void TreeMask::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const int64_t B = in[0].shape(0), N = in[0].shape(1);
  encoder_for(stream(), in, out)
      .dispatch([par = ptr<int32_t>(in[0]), nn = ptr<int32_t>(in[1]), o = ptr<uint8_t>(out[0]), B, N,
                 packed = packed_]() {
        // a node count outside [0, N] is clamped; a parent not in [-1, i) makes node i a root
        // (it sees only itself): the kernel copies the parent's row, which must precede i
        std::vector<int32_t> parent(B * N), count(B);
        for (int64_t b = 0; b < B; ++b) {
          count[b] = std::clamp<int32_t>(nn[b], 0, static_cast<int32_t>(N));
          for (int64_t i = 0; i < N; ++i) {
            const int32_t p = par[b * N + i];
            parent[b * N + i] = p >= 0 && p < i ? p : -1;
          }
        }
        if (packed) {
          cpu::tree_mask_packed<int32_t>(parent.data(), count.data(), N, reinterpret_cast<int32_t*>(o), 0, B);
        } else {
          cpu::tree_mask_bool<int32_t>(parent.data(), count.data(), N, reinterpret_cast<bool*>(o), 0, B);
        }
      });
}

void TreeMask::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::tree_mask(in, out, packed_, stream());
#else
  no_gpu("tree_mask");
#endif
}

// =============================================================================================
// verify_greedy / verify_sample

namespace {

void check_verify(const char* op, const mx::array& logits, const mx::array& beams, const mx::array& beam_node) {
  check_rank(op, "logits", logits, 3, "B, N, V");
  check_float(op, "logits", logits);
  check_rank(op, "beams", beams, 3, "B, W, L");
  check_dtype(op, "beams", beams, mx::int32, "int32");
  check_rank(op, "beam_node", beam_node, 3, "B, W, L");
  check_dtype(op, "beam_node", beam_node, mx::int32, "int32");
  const int B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
  if (W < 1 || L < 1) fail(op, "beams must have W >= 1 and L >= 1, got shape " + shape_str(beams));
  check_dim(op, "logits", logits, 0, B, "B (beams dim 0)");
  if (logits.shape(1) < 1 + W * (L - 1)) {
    fail(op, "logits must cover N >= 1 + W*(L-1) = " + std::to_string(1 + W * (L - 1)) + " nodes, got shape " +
                 shape_str(logits));
  }
  if (logits.shape(2) < 1) fail(op, "logits must have V >= 1, got shape " + shape_str(logits));
  if (beam_node.shape() != beams.shape()) {
    fail(op, "beam_node must have the shape of beams " + shape_str(beams) + ", got " + shape_str(beam_node));
  }
}

// beam_node values index rows of logits: clamped into [0, n_logit_rows)
std::vector<int32_t> clamped_nodes(const int32_t* bn, int64_t n, int64_t n_logit_rows) {
  std::vector<int32_t> out(n);
  for (int64_t k = 0; k < n; ++k) out[k] = clamp_index(bn[k], static_cast<int32_t>(n_logit_rows));
  return out;
}

// Both verify ops give accept_len (B,), best_beam (B,), path_nodes (B, L), next_token (B,), int32.
std::vector<mx::Shape> verify_output_shapes(const mx::array& beams) {
  const int B = beams.shape(0), L = beams.shape(2);
  return {{B}, {B}, {B, L}, {B}};
}

std::vector<mx::array> verify_outputs(const mx::array& beams, std::shared_ptr<mx::Primitive> prim,
                                      std::vector<mx::array> inputs) {
  return mx::array::make_arrays(verify_output_shapes(beams), {mx::int32, mx::int32, mx::int32, mx::int32},
                                std::move(prim), std::move(inputs));
}

// Sizes of a verify op's evaluation inputs: logits (B, n_logit_rows, V), beams (B, W, L).
struct VerifySizes {
  int64_t B, W, L, n_logit_rows, V;
};

VerifySizes verify_sizes(const std::vector<mx::array>& in) {
  return {in[1].shape(0), in[1].shape(1), in[1].shape(2), in[0].shape(1), in[0].shape(2)};
}

}  // namespace

std::vector<mx::array> verify_greedy(const mx::array& logits, const mx::array& beams, const mx::array& beam_node,
                                     mx::StreamOrDevice s) {
  check_verify("verify_greedy", logits, beams, beam_node);
  auto st = mx::to_stream(s);
  return verify_outputs(beams, std::make_shared<VerifyGreedy>(st),
                        {dense(logits, st), dense(beams, st), dense(beam_node, st)});
}

std::vector<mx::Shape> VerifyGreedy::output_shapes(const std::vector<mx::array>& in) {
  return verify_output_shapes(in[1]);
}

void VerifyGreedy::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const auto [B, W, L, n_logit_rows, V] = verify_sizes(in);
  auto& enc = encoder_for(stream(), in, out);
  dispatch_float(in[0].dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    enc.dispatch([x = ptr<T>(in[0]), bm = ptr<int32_t>(in[1]), bn_in = ptr<int32_t>(in[2]),
                  acc = ptr<int32_t>(out[0]), best = ptr<int32_t>(out[1]), path = ptr<int32_t>(out[2]),
                  next = ptr<int32_t>(out[3]), B, W, L, n_logit_rows, V]() {
      // draft tokens are only compared with argmaxes; node ids index logits rows
      const std::vector<int32_t> bn = clamped_nodes(bn_in, B * W * L, n_logit_rows);
      std::vector<int32_t> argmax(B * n_logit_rows);  // per-node argmax cache
      cpu::verify_greedy<T, int32_t>(x, n_logit_rows, V, bm, bn.data(), W, L, argmax.data(), acc, best, path, next, 0,
                                     B);
    });
  });
}

void VerifyGreedy::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::verify_greedy(in, out, stream());
#else
  no_gpu("verify_greedy");
#endif
}

std::vector<mx::array> verify_sample(const mx::array& logits, const mx::array& beams, const mx::array& beam_node,
                                     const mx::array& accept_u, const mx::array& sample_u, double temperature,
                                     int top_k, double top_p, mx::StreamOrDevice s) {
  const char* op = "verify_sample";
  check_verify(op, logits, beams, beam_node);
  const int B = beams.shape(0), W = beams.shape(1), L = beams.shape(2);
  check_rank(op, "accept_u", accept_u, 3, "B, L-1, W");
  check_dtype(op, "accept_u", accept_u, mx::float32, "float32");
  if (accept_u.shape() != mx::Shape{B, L - 1, W}) {
    fail(op, "accept_u must have shape (B, L-1, W) = (" + std::to_string(B) + ", " + std::to_string(L - 1) + ", " +
                 std::to_string(W) + "), got " + shape_str(accept_u));
  }
  check_rank(op, "sample_u", sample_u, 1, "B");
  check_dtype(op, "sample_u", sample_u, mx::float32, "float32");
  check_dim(op, "sample_u", sample_u, 0, B, "B");
  if (!(temperature >= 0.0) || temperature == std::numeric_limits<double>::infinity()) {
    fail(op, "temperature must be a finite float >= 0");
  }
  if (top_k < 0) fail(op, "top_k must be >= 0 (0: no top-k)");
  if (!(top_p > 0.0 && top_p <= 1.0)) fail(op, "top_p must be in (0, 1] (1: no top-p)");
  if (temperature == 0.0) return verify_greedy(logits, beams, beam_node, s);  // greedy, exactly
  auto st = mx::to_stream(s);
  return verify_outputs(
      beams, std::make_shared<VerifySample>(st, temperature, top_k, top_p),
      {dense(logits, st), dense(beams, st), dense(beam_node, st), dense(accept_u, st), dense(sample_u, st)});
}

std::vector<mx::Shape> VerifySample::output_shapes(const std::vector<mx::array>& in) {
  return verify_output_shapes(in[1]);
}

void VerifySample::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  for (auto& o : out) alloc(o);
  const auto [B, W, L, n_logit_rows, V] = verify_sizes(in);
  auto& enc = encoder_for(stream(), in, out);
  dispatch_float(in[0].dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    enc.dispatch([x = ptr<T>(in[0]), bm_in = ptr<int32_t>(in[1]), bn_in = ptr<int32_t>(in[2]),
                  au = ptr<float>(in[3]), su = ptr<float>(in[4]), acc = ptr<int32_t>(out[0]),
                  best = ptr<int32_t>(out[1]), path = ptr<int32_t>(out[2]), next = ptr<int32_t>(out[3]), B, W, L,
                  n_logit_rows, V, temperature = temperature_, top_k = int64_t{top_k_}, top_p = top_p_]() {
      // node ids index logits rows and draft tokens index the probabilities: both clamped.
      // Uniforms outside [0, 1) cannot index anything (they only make a decision or a draw odd).
      const std::vector<int32_t> bn = clamped_nodes(bn_in, B * W * L, n_logit_rows);
      std::vector<int32_t> bm(bm_in, bm_in + B * W * L);
      for (int64_t k = 0; k < B * W * L; ++k) {
        if (k % L != 0) bm[k] = clamp_index(bm[k], static_cast<int32_t>(V));
      }
      cpu::verify_sample<T, int32_t>(x, n_logit_rows, V, bm.data(), bn.data(), W, L, au, su, temperature, top_k, top_p,
                                     acc, best, path, next, 0, B);
    });
  });
}

void VerifySample::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  metal::verify_sample(in, out, static_cast<float>(temperature_), top_k_, static_cast<float>(top_p_), stream());
#else
  no_gpu("verify_sample");
#endif
}

// =============================================================================================
// kv_compact

std::vector<mx::array> kv_compact(const mx::array& kv, const mx::array& cache_len, const mx::array& path_nodes,
                                  const mx::array& accept_len, mx::StreamOrDevice s) {
  const char* op = "kv_compact";
  check_rank(op, "kv", kv, 6, "n_layers, 2, B, H_kv, S, D");
  check_float(op, "kv", kv);
  if (kv.shape(1) != 2) fail(op, "kv dim 1 must be 2 (K and V), got shape " + shape_str(kv));
  const int B = kv.shape(2), S = kv.shape(4);
  check_rank(op, "cache_len", cache_len, 1, "B");
  check_dtype(op, "cache_len", cache_len, mx::int32, "int32");
  check_dim(op, "cache_len", cache_len, 0, B, "B (kv dim 2)");
  check_rank(op, "path_nodes", path_nodes, 2, "B, L");
  check_dtype(op, "path_nodes", path_nodes, mx::int32, "int32");
  check_dim(op, "path_nodes", path_nodes, 0, B, "B (kv dim 2)");
  check_rank(op, "accept_len", accept_len, 1, "B");
  check_dtype(op, "accept_len", accept_len, mx::int32, "int32");
  check_dim(op, "accept_len", accept_len, 0, B, "B (kv dim 2)");
  const int L = path_nodes.shape(1);
  if (L < 1 || L > S) {
    fail(op, "path_nodes length L=" + std::to_string(L) + " must be in [1, S=" + std::to_string(S) + "]");
  }
  auto st = mx::to_stream(s);
  return mx::array::make_arrays({kv.shape(), {B}}, {kv.dtype(), mx::int32}, std::make_shared<KvCompact>(st),
                                {dense(kv, st), dense(cache_len, st), dense(path_nodes, st), dense(accept_len, st)});
}

std::vector<mx::Shape> KvCompact::output_shapes(const std::vector<mx::array>& in) {
  return {in[0].shape(), in[1].shape()};
}

namespace {

// MLX gives every output of a multi-output primitive its own copy of the input list, so an input
// that nothing else holds still has one reference per output and never counts as donatable. The
// other outputs' copies are dropped here, as MLX's detach() does right after this evaluation;
// under a transformation (tracer arrays: compile, grad) the graph stays intact and nothing is
// donated (MLX then holds an extra reference to the inputs itself).
void release_sibling_inputs(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  for (const auto& o : outputs) {
    if (o.is_tracer()) return;
  }
  for (auto& o : outputs) {
    if (&o.inputs() != &inputs) o.inputs().clear();
  }
}

// Output `out` takes over the buffer of input `in` when nothing else can see it (MLX's donation
// rule: only this graph node holds the array and its data), else gets a fresh buffer that the task
// fills with a copy first. Returns whether a copy is due.
bool donate_or_alloc(const mx::array& in, mx::array& out) {
  if (in.is_donatable() && in.flags().row_contiguous && in.data_size() == in.size() &&
      in.itemsize() == out.itemsize()) {
    out.copy_shared_buffer(in);
    return false;
  }
  alloc(out);
  return true;
}

}  // namespace

void KvCompact::eval_cpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
  release_sibling_inputs(in, out);
  const auto &kv = in[0], &cache_len = in[1], &path_nodes = in[2], &accept_len = in[3];
  const bool copy_kv = donate_or_alloc(kv, out[0]);
  const bool copy_len = donate_or_alloc(cache_len, out[1]);
  const int64_t B = kv.shape(2), H = kv.shape(3), S = kv.shape(4), L = path_nodes.shape(1);
  const int64_t slot_bytes = kv.shape(5) * static_cast<int64_t>(kv.itemsize());
  const int64_t units = static_cast<int64_t>(kv.shape(0)) * 2 * B * H;
  encoder_for(stream(), in, out)
      .dispatch([kv_in = ptr<uint8_t>(kv), kv_out = ptr<uint8_t>(out[0]), kv_bytes = kv.nbytes(),
                 len_in = ptr<int32_t>(cache_len), len_out = ptr<int32_t>(out[1]), path = ptr<int32_t>(path_nodes),
                 acc_in = ptr<int32_t>(accept_len), copy_kv, copy_len, B, H, S, L, slot_bytes, units]() {
        if (copy_kv && kv_bytes > 0) std::memcpy(kv_out, kv_in, kv_bytes);
        if (copy_len && B > 0) std::memcpy(len_out, len_in, static_cast<size_t>(B) * sizeof(int32_t));
        // A row whose values would move K/V out of its cache (accept_len outside [-1, L-1],
        // cache_len outside [0, S], a path node before its position or past S) is left untouched,
        // as an inactive row: the kernel then neither copies nor advances it.
        std::vector<int32_t> acc(B);
        for (int64_t b = 0; b < B; ++b) {
          const bool ok = cpu::kv_row_fault(acc_in[b], len_out[b], path + b * L, L, S).kind == cpu::KvRowFault::kNone;
          acc[b] = ok ? acc_in[b] : -1;
        }
        if (units > 0 && slot_bytes > 0) {
          cpu::kv_compact<int32_t>(kv_out, B, H, S, slot_bytes, len_out, path, L, acc.data(), 0, units);
        }
        cpu::kv_compact_advance<int32_t>(len_out, acc.data(), B);
      });
}

void KvCompact::eval_gpu(const std::vector<mx::array>& in, std::vector<mx::array>& out) {
#ifdef REDRAFTER_MLX_METAL
  release_sibling_inputs(in, out);  // lets the dispatch donate kv / cache_len (see above)
  metal::kv_compact(in, out, stream());
#else
  no_gpu("kv_compact");
#endif
}

}  // namespace redrafter::mlx_ext
