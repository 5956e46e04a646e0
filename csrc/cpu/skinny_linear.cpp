// y = x @ W^T (+ bias) for the few rows of a decode step or a tree verify, over a packed W.
//
// With M <= ~16 rows the product is bound by reading W once from memory; a BLAS GEMM packs W on
// every call and a GEMV handles one row, so both cost about M-fold of what the weight read does.
// This kernel streams the packed weight once (4 output rows x 16 inputs per 256-byte tile, the
// whole weight one sequential stream, prefetched ahead) and keeps up to 4x4 accumulators of 16
// lanes per tile with AVX-512, or with AVX2 4 x 2 of 8 lanes (one x row a pass) up to 2 rows and
// 2 x 3 x 2 in intrinsics from 3 rows, picked at run time. Each output is summed in the same order
// whatever M and the thread split are, so a row's result does not depend on the rows beside it (a
// tree verify's linears then match a one-token step bit for bit).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "cpu/kernels.h"
#include "cpu/target.h"

namespace redrafter::cpu {
namespace {

constexpr int64_t kNR = kSkinnyTileRows;    // output rows per tile
constexpr int64_t kKB = kSkinnyTileDepth;   // inputs per tile
constexpr int64_t kBlockTiles = 16;         // tiles (64 rows of W, ~147 KB at K=576) kept in L2 across passes
constexpr int64_t kPrefetch = 1024;         // floats ahead (4 KB): measured 1-4K x the same, 0 is 1.3x slower at M=4

typedef float f16v __attribute__((vector_size(64)));
typedef float f8v __attribute__((vector_size(32)));
typedef float f4v __attribute__((vector_size(16)));

// The vector a clone works in, and the x rows per pass that its registers hold: 4 weight rows x MR
// x rows x (16 / lanes) accumulators. A 64-byte vector without AVX-512 lives on the stack (GCC
// lowers it through memory: 3-5x slower than MKL on an AVX2 Zen 1), so AVX2 works in 8 lanes.
struct Wide { using V = f16v; static constexpr int kLanes = 16; static constexpr int64_t kMR = 4; };  // 16 of 32 zmm
struct Narrow { using V = f8v; static constexpr int kLanes = 8; static constexpr int64_t kMR = 1; };  // 8 of 16 ymm

template <class A>
RD_INLINE typename A::V load(const float* p) {
  typename A::V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A fixed pairwise order over the 16 lanes of one output, the same in every clone and width: lane i
// of the accumulators holds the same partial sum whether it sits in one 16-lane vector or in the
// i / 8-th of two 8-lane ones, so a result does not depend on the CPU's vector width either.
RD_INLINE float hsum8(f8v a) {
  const f4v b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
RD_INLINE float hsum(const f16v (&v)[1]) {
  return hsum8(__builtin_shufflevector(v[0], v[0], 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v[0], v[0], 8, 9, 10, 11, 12, 13, 14, 15));
}
RD_INLINE float hsum(const f8v (&v)[2]) { return hsum8(v[0] + v[1]); }

// One 16-input block of a tile: 4 weight rows times MR rows of x into the accumulators.
template <class A, int MR, int S = kKB / A::kLanes>
RD_INLINE void fma_block(const float* p, const typename A::V (&xv)[MR][S], typename A::V (&acc)[kNR][MR][S]) {
  for (int r = 0; r < kNR; ++r) __builtin_prefetch(p + r * kKB + kPrefetch, 0, 3);
  for (int r = 0; r < kNR; ++r) {
    for (int j = 0; j < S; ++j) {
      const typename A::V wv = load<A>(p + r * kKB + j * A::kLanes);
      for (int m = 0; m < MR; ++m) acc[r][m][j] += wv * xv[m][j];
    }
  }
}

template <class A, int MR, int S = kKB / A::kLanes>
RD_INLINE void load_x(const float* x, int64_t stride, typename A::V (&xv)[MR][S]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < S; ++j) xv[m][j] = load<A>(x + m * stride + j * A::kLanes);
}

// One tile (output rows 4t..4t+3) for MR rows of x. xtail: the rows' last, zero-padded 16 inputs
// (the packed weight is zero there too), so a short K costs no scalar loop and no read past x.
template <class A, int MR>
RD_INLINE void tile(const float* x, int64_t K, const float* xtail, const float* wt, const float* bias, int64_t N,
                    float* y, int64_t t) {
  constexpr int S = kKB / A::kLanes;
  typename A::V acc[kNR][MR][S];
  for (int r = 0; r < kNR; ++r)
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < S; ++j) acc[r][m][j] = typename A::V{};
  const int64_t kfull = K / kKB;
  const float* p = wt;
  for (int64_t kb = 0; kb < kfull; ++kb, p += kNR * kKB) {
    typename A::V xv[MR][S];
    load_x<A, MR>(x + kb * kKB, K, xv);
    fma_block<A, MR>(p, xv, acc);
  }
  if (K % kKB) {
    typename A::V xv[MR][S];
    load_x<A, MR>(xtail, kKB, xv);
    fma_block<A, MR>(p, xv, acc);
  }
  for (int r = 0; r < kNR; ++r) {
    const int64_t n = t * kNR + r;
    if (n >= N) break;
    const float b = bias ? bias[n] : 0.0f;
    for (int m = 0; m < MR; ++m) y[m * N + n] = hsum(acc[r][m]) + b;
  }
}

template <class A, int MR>
RD_INLINE void pass(const float* x, int64_t K, const float* packed, const float* bias, int64_t N, float* y,
                    int64_t t0, int64_t t1) {
  const int64_t kblocks = (K + kKB - 1) / kKB;
  float xtail[MR * kKB] = {};
  if (K % kKB) {
    for (int m = 0; m < MR; ++m) std::memcpy(xtail + m * kKB, x + m * K + (K / kKB) * kKB, (K % kKB) * sizeof(float));
  }
  for (int64_t t = t0; t < t1; ++t) tile<A, MR>(x, K, xtail, packed + t * kblocks * kNR * kKB, bias, N, y, t);
}

// Rows m..m+n-1 of x (1 <= n <= A::kMR) over tiles [t0, t1).
template <class A>
RD_INLINE void pass_rows(int64_t n, const float* x, int64_t K, const float* packed, const float* bias, int64_t N,
                         float* y, int64_t t0, int64_t t1) {
  switch (n) {
    case 4: if constexpr (A::kMR >= 4) pass<A, 4>(x, K, packed, bias, N, y, t0, t1); break;
    case 3: if constexpr (A::kMR >= 3) pass<A, 3>(x, K, packed, bias, N, y, t0, t1); break;
    case 2: if constexpr (A::kMR >= 2) pass<A, 2>(x, K, packed, bias, N, y, t0, t1); break;
    case 1: pass<A, 1>(x, K, packed, bias, N, y, t0, t1); break;
    default: break;
  }
}

// More than MR rows: blocks of tiles stay in L2 while every pass of MR x rows reads them (one trip
// to memory). Up to MR rows: one pass over the whole range.
template <class A>
RD_INLINE void run(const float* x, int64_t M, int64_t K, const float* packed, const float* bias, int64_t N, float* y,
                   int64_t tile_begin, int64_t tile_end) {
  const int64_t block = M <= A::kMR ? std::max<int64_t>(1, tile_end - tile_begin) : kBlockTiles;
  for (int64_t b0 = tile_begin; b0 < tile_end; b0 += block) {
    const int64_t b1 = std::min(b0 + block, tile_end);
    for (int64_t m = 0; m < M; m += A::kMR) {
      pass_rows<A>(std::min(A::kMR, M - m), x + m * K, K, packed, bias, N, y + m * N, b0, b1);
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX2 + FMA in intrinsics. The generic 8-lane vectors above leave GCC keeping the accumulators on
// the stack (moved through general registers) inside a target clone: ~0.8 FMA per cycle, so every
// x row past the first cost ~0.6 of a one-row pass on a Zen 3. Here NS of a tile's 4 weight rows
// meet MR x rows at a time (NS x MR x 2 accumulators in registers), and the sub-passes over one
// tile's weights (4 x K floats, 9-25 KB) run back to back while they sit in L1, so W comes from
// memory once for any M. Each lane adds its products in the same order as `tile` (one FMA per
// 16-input block) and is reduced by the same `hsum`, so outputs do not depend on M or the split.
#define RD_AVX2_INLINE inline __attribute__((always_inline, target("avx2,fma")))
// 2 x 3 x 2 = 12 accumulators + 2 weights + 1 x of 16 ymm; 4 x 2 and 2 x 4 measured 3-8% slower.
constexpr int kAvx2SubRows = 2;  // weight rows per sub-pass
constexpr int kAvx2MR = 3;       // x rows per sub-pass

// One 16-input block: NS weight rows (p, row stride 16) x MR rows of x (xk, row stride xs).
template <int NS, int MR>
RD_AVX2_INLINE void avx2_block(const float* p, const float* xk, int64_t xs, __m256 (&acc)[NS][MR][2]) {
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    __m256 w[NS];
#pragma GCC unroll 4
    for (int s = 0; s < NS; ++s) w[s] = _mm256_loadu_ps(p + s * kKB + j * 8);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(xk + m * xs + j * 8);
#pragma GCC unroll 4
      for (int s = 0; s < NS; ++s) acc[s][m][j] = _mm256_fmadd_ps(w[s], xv, acc[s][m][j]);
    }
  }
}

// Weight rows r0..r0+NS-1 of one tile against MR rows of x (row stride K), outputs n0 + r0 + s.
template <int NS, int MR>
RD_AVX2_INLINE void avx2_rows(const float* x, int64_t K, const float* xtail, const float* wt, int r0,
                              bool prefetch, const float* bias, int64_t N, float* y, int64_t n0) {
  __m256 acc[NS][MR][2];
#pragma GCC unroll 16
  for (int s = 0; s < NS; ++s)
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) acc[s][m][0] = acc[s][m][1] = _mm256_setzero_ps();
  const int64_t kfull = K / kKB;
  const float* p = wt + r0 * kKB;
  for (int64_t kb = 0; kb < kfull; ++kb, p += kNR * kKB) {
    if (prefetch) {
#pragma GCC unroll 4
      for (int r = 0; r < kNR; ++r) _mm_prefetch(reinterpret_cast<const char*>(p - r0 * kKB + r * kKB + kPrefetch), _MM_HINT_T0);
    }
    avx2_block<NS, MR>(p, x + kb * kKB, K, acc);
  }
  if (xtail) avx2_block<NS, MR>(p, xtail, kKB, acc);
#pragma GCC unroll 4
  for (int s = 0; s < NS; ++s) {
    const int64_t n = n0 + r0 + s;
    if (n >= N) break;
    const float b = bias ? bias[n] : 0.0f;
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const f8v v[2] = {acc[s][m][0], acc[s][m][1]};
      y[m * N + n] = hsum(v) + b;
    }
  }
}

template <int MR>
RD_AVX2_INLINE void avx2_tile(const float* x, int64_t K, const float* xtail, const float* wt, bool prefetch,
                              const float* bias, int64_t N, float* y, int64_t t) {
  if constexpr (MR == 1) {
    avx2_rows<kNR, 1>(x, K, xtail, wt, 0, prefetch, bias, N, y, t * kNR);
  } else {
#pragma GCC unroll 4
    for (int r0 = 0; r0 < kNR; r0 += kAvx2SubRows)
      avx2_rows<kAvx2SubRows, MR>(x, K, xtail, wt, r0, prefetch && r0 == 0, bias, N, y, t * kNR);
  }
}

// Tile by tile; within a tile, x in chunks of kAvx2MR rows (a last lone row takes all 4 weight rows).
__attribute__((target("avx2,fma"))) void run_avx2(const float* x, int64_t M, int64_t K, const float* packed,
                                                   const float* bias, int64_t N, float* y, int64_t tile_begin,
                                                   int64_t tile_end) {
  const int64_t kblocks = (K + kKB - 1) / kKB;
  const int64_t chunks = (M + kAvx2MR - 1) / kAvx2MR;
  // every row's last 16 inputs, zero-padded (the packed weight is zero there too), made once per call
  std::vector<float> xtails(K % kKB ? M * kKB : 0, 0.0f);
  for (int64_t m = 0; m < M && !xtails.empty(); ++m)
    std::memcpy(xtails.data() + m * kKB, x + m * K + (K / kKB) * kKB, (K % kKB) * sizeof(float));
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const float* wt = packed + t * kblocks * kNR * kKB;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t m0 = c * kAvx2MR, mr = std::min<int64_t>(kAvx2MR, M - m0);
      const float* xm = x + m0 * K;
      const float* xtail = xtails.empty() ? nullptr : xtails.data() + m0 * kKB;
      float* ym = y + m0 * N;
      const bool prefetch = c == 0;
      switch (mr) {
        case 3: avx2_tile<3>(xm, K, xtail, wt, prefetch, bias, N, ym, t); break;
        case 2: avx2_tile<2>(xm, K, xtail, wt, prefetch, bias, N, ym, t); break;
        default: avx2_tile<1>(xm, K, xtail, wt, prefetch, bias, N, ym, t); break;
      }
    }
  }
}
#endif

}  // namespace

RD_CLONES("arch=x86-64-v4", "arch=x86-64-v3")
void skinny_linear(const float* x, int64_t M, int64_t K, const float* packed, const float* bias, int64_t N, float* y,
                   int64_t tile_begin, int64_t tile_end) {
  if (__builtin_cpu_supports("avx512f")) {
    run<Wide>(x, M, K, packed, bias, N, y, tile_begin, tile_end);
#if defined(__x86_64__) && defined(__GNUC__)
  } else if (M >= 3 && K >= 4 * kKB && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    // measured on a Zen 3: 1.03-1.24x from 3 rows; at 1-2 rows or K < 64 the generic pass was as fast or faster
    run_avx2(x, M, K, packed, bias, N, y, tile_begin, tile_end);
#endif
  } else {
    run<Narrow>(x, M, K, packed, bias, N, y, tile_begin, tile_end);
  }
}

}  // namespace redrafter::cpu
