// y = x @ W^T (+ bias) for the few rows of a decode step or a tree verify, over a packed W.
//
// With M <= ~16 rows the product is bound by reading W once from memory; a BLAS GEMM packs W on
// every call and a GEMV handles one row, so both cost about M-fold of what the weight read does.
// This kernel streams the packed weight once (4 output rows x 16 inputs per 256-byte tile, the
// whole weight one sequential stream, prefetched ahead) and keeps up to 4x4 accumulators of 16
// lanes per tile. Each output is summed in the same order whatever M and the thread split are, so
// a row's result does not depend on the rows beside it (a tree verify's linears then match a
// one-token step bit for bit).
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/target.h"

namespace redrafter::cpu {
namespace {

constexpr int64_t kNR = kSkinnyTileRows;    // output rows per tile
constexpr int64_t kKB = kSkinnyTileDepth;   // inputs per tile
constexpr int64_t kMR = 4;                  // x rows per pass (4 x 4 accumulators fit 32 registers)
constexpr int64_t kBlockTiles = 16;         // tiles (64 rows of W, ~147 KB at K=576) kept in L2 across passes
constexpr int64_t kPrefetch = 1024;         // floats ahead (4 KB): measured 1-4K x the same, 0 is 1.3x slower at M=4

typedef float f16v __attribute__((vector_size(64)));
typedef float f8v __attribute__((vector_size(32)));
typedef float f4v __attribute__((vector_size(16)));

RD_INLINE f16v load16(const float* p) {
  f16v v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A fixed pairwise order, the same in every clone of a build.
RD_INLINE float hsum(f16v v) {
  const f8v a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f4v b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// One 16-input block of a tile: 4 weight rows times MR rows of x into the accumulators.
template <int MR>
RD_INLINE void fma_block(const float* p, const f16v (&xv)[MR], f16v (&acc)[kNR][MR]) {
  for (int r = 0; r < kNR; ++r) __builtin_prefetch(p + r * kKB + kPrefetch, 0, 3);
  for (int r = 0; r < kNR; ++r) {
    const f16v wv = load16(p + r * kKB);
    for (int m = 0; m < MR; ++m) acc[r][m] += wv * xv[m];
  }
}

// One tile (output rows 4t..4t+3) for MR rows of x. xtail: the rows' last, zero-padded 16 inputs
// (the packed weight is zero there too), so a short K costs no scalar loop and no read past x.
template <int MR>
RD_INLINE void tile(const float* x, int64_t K, const float* xtail, const float* wt, const float* bias, int64_t N,
                    float* y, int64_t t) {
  f16v acc[kNR][MR];
  for (int r = 0; r < kNR; ++r)
    for (int m = 0; m < MR; ++m) acc[r][m] = f16v{};
  const int64_t kfull = K / kKB;
  const float* p = wt;
  for (int64_t kb = 0; kb < kfull; ++kb, p += kNR * kKB) {
    f16v xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = load16(x + m * K + kb * kKB);
    fma_block<MR>(p, xv, acc);
  }
  if (K % kKB) {
    f16v xv[MR];
    for (int m = 0; m < MR; ++m) xv[m] = load16(xtail + m * kKB);
    fma_block<MR>(p, xv, acc);
  }
  for (int r = 0; r < kNR; ++r) {
    const int64_t n = t * kNR + r;
    if (n >= N) break;
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsum(acc[r][m]) + b;
  }
}

template <int MR>
RD_INLINE void pass(const float* x, int64_t K, const float* packed, const float* bias, int64_t N, float* y,
                    int64_t t0, int64_t t1) {
  const int64_t kblocks = (K + kKB - 1) / kKB;
  float xtail[MR * kKB] = {};
  if (K % kKB) {
    for (int m = 0; m < MR; ++m) std::memcpy(xtail + m * kKB, x + m * K + (K / kKB) * kKB, (K % kKB) * sizeof(float));
  }
  for (int64_t t = t0; t < t1; ++t) tile<MR>(x, K, xtail, packed + t * kblocks * kNR * kKB, bias, N, y, t);
}

// Rows m..m+n-1 of x (1 <= n <= 4) over tiles [t0, t1).
RD_INLINE void pass_rows(int64_t n, const float* x, int64_t K, const float* packed, const float* bias, int64_t N,
                         float* y, int64_t t0, int64_t t1) {
  switch (n) {
    case 4: pass<4>(x, K, packed, bias, N, y, t0, t1); break;
    case 3: pass<3>(x, K, packed, bias, N, y, t0, t1); break;
    case 2: pass<2>(x, K, packed, bias, N, y, t0, t1); break;
    case 1: pass<1>(x, K, packed, bias, N, y, t0, t1); break;
    default: break;
  }
}

}  // namespace

RD_CLONES("arch=x86-64-v4", "arch=x86-64-v3")
void skinny_linear(const float* x, int64_t M, int64_t K, const float* packed, const float* bias, int64_t N, float* y,
                   int64_t tile_begin, int64_t tile_end) {
  // More than 4 rows: blocks of tiles stay in L2 while every pass of 4 x rows reads them (one trip
  // to memory). Up to 4 rows: one pass over the whole range.
  const int64_t block = M <= kMR ? std::max<int64_t>(1, tile_end - tile_begin) : kBlockTiles;
  for (int64_t b0 = tile_begin; b0 < tile_end; b0 += block) {
    const int64_t b1 = std::min(b0 + block, tile_end);
    for (int64_t m = 0; m < M; m += kMR) {
      pass_rows(std::min(kMR, M - m), x + m * K, K, packed, bias, N, y + m * N, b0, b1);
    }
  }
}

}  // namespace redrafter::cpu
