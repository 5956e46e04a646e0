// Negative controls for the Metal emulator: deliberately broken kernels that the shim must catch.
// Not part of the package; compiled only into the emulation test module.
//   buffer(0) out [n] int32; threadgroup: n threads (a multiple of 32), one threadgroup.
#include <metal_stdlib>
using namespace metal;

// Reverses the threads' values through threadgroup memory but forgets the barrier between the
// write and the read: a thread can read its partner's slot before the partner wrote it (garbage).
[[kernel]] void missing_barrier(device int* out [[buffer(0)]], uint i [[thread_position_in_threadgroup]],
                                uint n [[threads_per_threadgroup]]) {
  threadgroup int s[1024];
  s[i] = int(i) * 7 + 1;
  // threadgroup_barrier(mem_flags::mem_threadgroup);  <- missing
  out[i] = s[n - 1 - i];
}

// The same with the barrier: must pass under every schedule.
[[kernel]] void with_barrier(device int* out [[buffer(0)]], uint i [[thread_position_in_threadgroup]],
                             uint n [[threads_per_threadgroup]]) {
  threadgroup int s[1024];
  s[i] = int(i) * 7 + 1;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = s[n - 1 - i];
}

// Odd and even threads wait at different barriers.
[[kernel]] void divergent_barrier(device int* out [[buffer(0)]], uint i [[thread_position_in_threadgroup]]) {
  if (i % 2) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  } else {
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  out[i] = int(i);
}

// The first simdgroup returns early; the others wait at a barrier for it.
[[kernel]] void exit_before_barrier(device int* out [[buffer(0)]], uint i [[thread_position_in_threadgroup]]) {
  if (i < 32) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  out[i] = int(i);
}

// Half a simdgroup takes part in a simd_sum.
[[kernel]] void divergent_simd(device int* out [[buffer(0)]], uint i [[thread_position_in_threadgroup]]) {
  int v = int(i);
  if (i % 32 < 16) v = simd_sum(v);
  out[i] = v;
}
