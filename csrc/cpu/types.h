// The 16-bit float storage types the CPU kernels are instantiated for. The torch build uses c10's
// (so its launchers pass tensor pointers as they are); torch-free builds (REDRAFTER_CPU_NO_C10,
// the MLX extension) use 2-byte structs of the same IEEE half / bfloat16 bits: the kernels only
// ever reinterpret them as uint16_t and convert to float (cpu/rows.h).
#pragma once
#include <cstdint>

#ifndef REDRAFTER_CPU_NO_C10
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#endif

namespace redrafter::cpu {
#ifdef REDRAFTER_CPU_NO_C10
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
#else
using Half = c10::Half;
using BFloat16 = c10::BFloat16;
#endif
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2, "16-bit storage types must be 2 bytes");
}  // namespace redrafter::cpu
