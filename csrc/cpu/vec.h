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

// Index of the first x[j] > t, j in [0, n), or n when there is none (NaN is never above).
int64_t first_above(const float* x, int64_t n, float t);

void half_to_float(const uint16_t* src, float* dst, int64_t n);
void bfloat16_to_float(const uint16_t* src, float* dst, int64_t n);

}  // namespace redrafter::cpu::vec
