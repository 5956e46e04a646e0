#include "cpu/vec.h"

#include <cstring>
#include <limits>

#include "cpu/target.h"

#define RD_VEC_CLONES RD_CLONES("avx2")

namespace redrafter::cpu::vec {
namespace {

// GCC/Clang vector extensions: 8 lanes, one AVX2 register (two SSE registers on the baseline).
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

RD_INLINE f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
RD_INLINE f8 splat(float x) { return f8{x, x, x, x, x, x, x, x}; }
RD_INLINE f8 select(i8 mask, f8 a, f8 b) {  // mask lanes are 0 or -1
  i8 ai, bi;
  std::memcpy(&ai, &a, sizeof a);
  std::memcpy(&bi, &b, sizeof b);
  const i8 r = (ai & mask) | (bi & ~mask);
  f8 out;
  std::memcpy(&out, &r, sizeof out);
  return out;
}

// exp(x) for x <= 0 (Cephes expf: range reduction by ln 2, degree-6 polynomial, ~1-2 ulp).
// exp(-87) ~ 1.6e-38 stands in for smaller results, including exp(-inf): negligible in a sum that
// contains exp(0) = 1. NaN propagates.
RD_INLINE f8 exp_nonpositive(f8 x) {
  x = select(x < splat(-87.0f), splat(-87.0f), x);
  const f8 magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const f8 n = (x * splat(1.44269504088896341f) + magic) - magic;
  f8 r = x - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  f8 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const f8 y = p * (r * r) + r + splat(1.0f);
  const i8 bits = (__builtin_convertvector(n, i8) + 127) << 23;
  f8 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

RD_INLINE float exp_nonpositive(float x) {
  float lanes[8] = {x, 0, 0, 0, 0, 0, 0, 0};
  const f8 v = exp_nonpositive(load(lanes));
  return v[0];
}

}  // namespace

RD_VEC_CLONES BlockMax block_max(const float* x, int64_t n) {
  const float ninf = -std::numeric_limits<float>::infinity();
  f8 m0 = splat(ninf), m1 = splat(ninf);
  i8 nan0 = i8{}, nan1 = i8{};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const f8 a = load(x + i), b = load(x + i + 8);
    m0 = select(a > m0, a, m0);  // NaN compares false: ignored here, flagged below
    m1 = select(b > m1, b, m1);
    nan0 |= (a != a);
    nan1 |= (b != b);
  }
  m0 = select(m1 > m0, m1, m0);
  nan0 |= nan1;
  float m = ninf;
  bool nan = false;
  for (int k = 0; k < 8; ++k) {
    m = m0[k] > m ? m0[k] : m;
    nan = nan || nan0[k] != 0;
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nan = nan || x[i] != x[i];
  }
  return {m, nan};
}

RD_VEC_CLONES double block_sum_exp(const float* x, int64_t n, float m) {
  const f8 mv = splat(m);
  f8 s0 = splat(0.0f), s1 = splat(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 += exp_nonpositive(load(x + i) - mv);
    s1 += exp_nonpositive(load(x + i + 8) - mv);
  }
  s0 += s1;
  double s = 0.0;
  for (int k = 0; k < 8; ++k) s += s0[k];
  for (; i < n; ++i) s += exp_nonpositive(x[i] - m);
  return s;
}

RD_VEC_CLONES int64_t collect_above(const float* x, int64_t n, float t, int32_t* idx) {
  const f8 tv = splat(t);
  int64_t c = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const i8 m = (load(x + i) > tv) | (load(x + i + 8) > tv);
    uint64_t w[4];
    std::memcpy(w, &m, sizeof w);
    if ((w[0] | w[1] | w[2] | w[3]) == 0) continue;
    for (int64_t k = i; k < i + 16; ++k) {
      if (x[k] > t) idx[c++] = static_cast<int32_t>(k);
    }
  }
  for (; i < n; ++i) {
    if (x[i] > t) idx[c++] = static_cast<int32_t>(i);
  }
  return c;
}

// IEEE half -> float without F16C and without denormal float arithmetic (so flush-to-zero modes
// cannot change the result): normals by exponent rebias and a multiply, subnormals by a magic
// subtraction (the scheme of FP16/c10's fp16_ieee_to_fp32_value), 8 lanes at a time.
typedef uint16_t u16x8 __attribute__((vector_size(16)));
typedef uint32_t u8x32 __attribute__((vector_size(32)));

RD_INLINE f8 half8_to_float(u16x8 h) {
  const u8x32 w = __builtin_convertvector(h, u8x32) << 16;
  const u8x32 sign = w & 0x80000000u;
  const u8x32 two_w = w + w;
  const u8x32 nb = (two_w >> 4) + (0xE0u << 23);
  f8 normal;
  std::memcpy(&normal, &nb, sizeof normal);
  normal *= splat(0x1.0p-112f);
  const u8x32 db = (two_w >> 17) | (126u << 23);
  f8 denormal;
  std::memcpy(&denormal, &db, sizeof denormal);
  denormal -= splat(0.5f);
  u8x32 nbits, dbits;
  std::memcpy(&nbits, &normal, sizeof nbits);
  std::memcpy(&dbits, &denormal, sizeof dbits);
  const u8x32 is_denormal = reinterpret_cast<u8x32>(two_w < (1u << 27));  // lanes 0 or ~0
  const u8x32 out = sign | (dbits & is_denormal) | (nbits & ~is_denormal);
  f8 f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

RD_VEC_CLONES void half_to_float(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    u16x8 h;
    std::memcpy(&h, src + i, sizeof h);
    const f8 f = half8_to_float(h);
    std::memcpy(dst + i, &f, sizeof f);
  }
  if (i < n) {
    uint16_t tail[8] = {};
    std::memcpy(tail, src + i, static_cast<size_t>(n - i) * sizeof(uint16_t));
    u16x8 h;
    std::memcpy(&h, tail, sizeof h);
    const f8 f = half8_to_float(h);
    std::memcpy(dst + i, &f, static_cast<size_t>(n - i) * sizeof(float));
  }
}

RD_VEC_CLONES void bfloat16_to_float(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, 4);
  }
}

}  // namespace redrafter::cpu::vec
