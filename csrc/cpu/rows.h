// Reading one row of logits as float blocks, whatever its storage dtype (float, Half, BFloat16 of
// cpu/types.h), and the candidate order shared by beam_topk's two phases.
#pragma once
#include <cmath>
#include <cstdint>

#include "cpu/types.h"
#include "cpu/vec.h"

namespace redrafter::cpu::detail {

// Values [off, off + n) of `row` as floats: a pointer into the row itself for float, else
// converted into `buf` (n <= vec::kBlock). Conversion to float is exact for both 16-bit types.
inline const float* load_block(const float* row, int64_t off, int64_t n, float* buf) { return row + off; }
inline const float* load_block(const Half* row, int64_t off, int64_t n, float* buf) {
  vec::half_to_float(reinterpret_cast<const uint16_t*>(row + off), buf, n);
  return buf;
}
inline const float* load_block(const BFloat16* row, int64_t off, int64_t n, float* buf) {
  vec::bfloat16_to_float(reinterpret_cast<const uint16_t*>(row + off), buf, n);
  return buf;
}

// The order of torch.sort(descending=True, stable=True): larger first, NaN above everything,
// equal values (and NaNs among themselves) by ascending index.
inline bool ranks_before(float a, int64_t ia, float b, int64_t ib) {
  if (std::isnan(a)) return !std::isnan(b) || ia < ib;
  if (std::isnan(b)) return false;
  if (a != b) return a > b;
  return ia < ib;
}

}  // namespace redrafter::cpu::detail
