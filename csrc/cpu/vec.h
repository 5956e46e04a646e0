// Row primitives shared by the CPU kernels: block max / NaN scan, sum of exponentials, and
// half/bfloat16 -> float conversion. Each is compiled for AVX2 and for baseline x86-64 and picked
// at load time (target_clones), so the module still runs on any x86-64 CPU.
#pragma once
#include <cstdint>

namespace redrafter::cpu::vec {

// Rows are processed in blocks of this many values (4 KiB of floats: a stack buffer stays in L1).
constexpr int64_t kBlock = 1024;

struct BlockMax {
  float max;  // largest non-NaN value, -inf when there is none
  bool nan;   // the block holds a NaN
};

BlockMax block_max(const float* x, int64_t n);

// sum_i exp(x[i] - m) in double (each block accumulated in float lanes); requires x[i] <= m
// or NaN (which propagates). Relative error of one term ~2 ulp.
double block_sum_exp(const float* x, int64_t n, float m);

// Writes the indices j in [0, n) with x[j] > t, ascending, to idx; returns their count
// (NaN is never above).
int64_t collect_above(const float* x, int64_t n, float t, int32_t* idx);

void half_to_float(const uint16_t* src, float* dst, int64_t n);
void bfloat16_to_float(const uint16_t* src, float* dst, int64_t n);

}  // namespace redrafter::cpu::vec
