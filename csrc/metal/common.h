// Helpers shared by the Metal kernels. Written in the MSL subset that the host emulator supports
// (tests/shim/metal_shim.h lists it), so the same sources run on the CPU under test.
// Threadgroups are 1-D; simdgroups have 32 threads (Apple GPUs); every group helper below must be
// called by every thread of the threadgroup (it contains barriers).
#pragma once
#include <metal_stdlib>

#include "params.h"

using namespace metal;

// Host names of template instantiations, as MLX's kernels do (e.g. "beam_topk_rows_float32").
#ifdef REDRAFTER_METAL_EMULATE
#define RD_CAT2(a, b) a##b
#define RD_CAT(a, b) RD_CAT2(a, b)
#define instantiate_kernel(name, func, ...) \
  static ::mtl_emu::Registrar RD_CAT(rd_registrar_, __LINE__)(name, &func<__VA_ARGS__>, func##__buffers);
#else
#define instantiate_kernel(name, func, ...) \
  template [[host_name(name)]] [[kernel]] decltype(func<__VA_ARGS__>) func<__VA_ARGS__>;
#endif

// bfloat16 logits are read as raw bits (no dependency on MSL's bfloat type).
struct bf16 {
  ushort bits;
};

inline float to_float(float x) { return x; }
inline float to_float(half x) { return float(x); }
inline float to_float(bf16 x) { return as_type<float>(uint(x.bits) << 16); }

inline bool is_nan(float x) { return x != x; }
inline float neg_inf() { return as_type<float>(0xff800000u); }
inline float pos_inf() { return as_type<float>(0x7f800000u); }
inline float quiet_nan() { return as_type<float>(0x7fc00000u); }

// A float's position in torch.sort(descending=True) order: larger floats give larger keys and
// every NaN the largest (NaNs compare equal, so the index breaks their ties).
inline uint order_key(float x) {
  if (is_nan(x)) return 0xffffffffu;
  const uint u = as_type<uint>(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The float whose order_key is k (inverse of order_key for non-NaN keys).
inline float key_to_float(uint k) { return as_type<float>((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }

// Contiguous positions per thread per tile in the index-order scans (ordered compaction, ranks).
constant constexpr int kScanItems = 8;

// Exclusive prefix sum of v over the threadgroup in thread order, and the group total (in every
// thread). scratch: 32 ints of threadgroup memory. Two barriers.
inline int group_prefix_sum(int v, threadgroup int* scratch, uint tid, uint nthreads, thread int& total) {
  const uint lane = tid % 32u, sg = tid / 32u, n_sg = (nthreads + 31u) / 32u;
  const int excl = simd_prefix_exclusive_sum(v);
  const int all = simd_sum(v);
  if (lane == 0) scratch[sg] = all;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  int before = 0, sum = 0;
  for (uint s = 0; s < n_sg; ++s) {
    const int c = scratch[s];
    before += s < sg ? c : 0;
    sum += c;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);  // scratch may be reused at once
  total = sum;
  return before + excl;
}

// Sum of v over the threadgroup, the same float in every thread (fixed order: butterfly within
// each simdgroup, then the simdgroups in index order). scratch: 32 floats. Two barriers.
inline float group_sum(float v, threadgroup float* scratch, uint tid, uint nthreads) {
  const uint n_sg = (nthreads + 31u) / 32u;
  const float s = simd_sum(v);
  if (tid % 32u == 0) scratch[tid / 32u] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint k = 0; k < n_sg; ++k) total += scratch[k];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}

inline int group_sum_int(int v, threadgroup int* scratch, uint tid, uint nthreads) {
  int total = 0;
  group_prefix_sum(v, scratch, tid, nthreads, total);
  return total;
}

// Maximum of v over the threadgroup (uint keys). scratch: 32 uints. Two barriers.
inline uint group_max_uint(uint v, threadgroup uint* scratch, uint tid, uint nthreads) {
  const uint n_sg = (nthreads + 31u) / 32u;
  const uint m = simd_max(v);
  if (tid % 32u == 0) scratch[tid / 32u] = m;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint r = 0;
  for (uint k = 0; k < n_sg; ++k) r = max(r, scratch[k]);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return r;
}

// Exclusive prefix sum of float v over the threadgroup in thread order, and the total (the same
// in every thread). scratch: 32 floats. Two barriers.
inline float group_prefix_sum_float(float v, threadgroup float* scratch, uint tid, uint nthreads,
                                    thread float& total) {
  const uint lane = tid % 32u, sg = tid / 32u, n_sg = (nthreads + 31u) / 32u;
  const float incl = simd_prefix_inclusive_sum(v);
  if (lane == 31u) scratch[sg] = incl;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float before = 0.0f, sum = 0.0f;
  for (uint s = 0; s < n_sg; ++s) {
    const float c = scratch[s];
    if (s < sg) before += c;
    sum += c;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  total = sum;
  return before + (incl - v);
}
