// Compiler helpers shared by the vectorised CPU kernels: a function compiled for several x86-64
// levels and chosen at load time (GCC target_clones), so the module runs on any x86-64 CPU and
// uses wider vectors where they exist; and a forced inline for the vector helpers inside it.
#pragma once

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define RD_CLONES(...) __attribute__((target_clones(__VA_ARGS__, "default")))
#else
#define RD_CLONES(...)
#endif
#if defined(__GNUC__)
#define RD_INLINE inline __attribute__((always_inline))
#else
#define RD_INLINE inline
#endif
