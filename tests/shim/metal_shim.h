// Host emulation of the Metal Shading Language subset our kernels use (csrc/metal/*.metal), on
// the fiber scheduler of tests/shim/cuda_shim.h (reused as is: one threadgroup at a time, its
// threads as fibers switched at barriers and simd collectives in a seeded random order; divergent
// barriers, collectives waiting for exited lanes and deadlocks are reported as launch errors).
// tests/emu/metal_build.py rewrites each .metal (and csrc/metal/*.h) before compiling it as C++
// with -DREDRAFTER_METAL_EMULATE:
//   #include <metal_stdlib>          -> #include "metal_shim.h"
//   [[kernel]] void f(params) {      -> void f(const ::mtl_emu::Bindings& __b) { <one local per
//                                       param>: [[buffer(k)]] params read buffer k of the launch,
//                                       [[thread_position_in_grid]] etc. read the fiber's position
//   threadgroup T name[N]...;        -> T (&name)[N]... = per-threadgroup storage, filled with
//                                       seeded garbage when the group starts
//   [[...]] left over                -> removed
// Kernels are found by their host name (instantiate_kernel in csrc/metal/common.h registers
// template instantiations; a non-template kernel registers under its own name).
//
// The MSL subset (what a kernel may use; anything else fails to compile here):
//   qualifiers device, constant, thread, threadgroup (pointers), kernel; scalar builtins
//   thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid,
//   threads_per_threadgroup, threadgroups_per_grid, thread_index_in_simdgroup,
//   simdgroup_index_in_threadgroup, threads_per_simdgroup, simdgroups_per_threadgroup (x only,
//   declared uint); buffers as `device T*` / `constant P&` with [[buffer(k)]]; static
//   `threadgroup T name[N];` declarations (no [[threadgroup(k)]] parameters);
//   threadgroup_barrier / simdgroup_barrier (any mem_flags); simd_shuffle, simd_shuffle_xor,
//   simd_shuffle_up, simd_shuffle_down, simd_broadcast, simd_sum, simd_max, simd_min,
//   simd_prefix_exclusive_sum, simd_prefix_inclusive_sum, simd_any, simd_all, simd_ballot
//   (32-lane simdgroups; every lane of the simdgroup must call them together);
//   atomic_uint / atomic_int with atomic_{load,store,fetch_add,fetch_sub,fetch_max,fetch_min,
//   fetch_or}_explicit (memory_order_relaxed); as_type<T>; precise::exp / precise::log /
//   precise::sqrt; max, min, clamp, abs on scalars; half (storage + conversion to float).
//   Types uint, ushort, uchar, ulong, uint2, uint4 (x, y, z, w members only).
// Not modelled: the GPU memory model (memory is sequentially consistent and a barrier's mem_flags
// are ignored), fast-math (the host libm is used), simd_* float reductions' hardware summation
// order (a butterfly here), occupancy and timing.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_shim.h"

namespace mtl_emu {

using redrafter_emu::Op;
using redrafter_emu::S;

// Buffer table of one dispatch: index -> pointer (set_buffer / set_bytes on the host side).
struct Bindings {
  static constexpr int kMax = 31;
  void* buf[kMax] = {};
};

using KernelFn = void (*)(const Bindings&);
struct Kernel {
  KernelFn fn;
  const int* buffers;  // buffer indices the kernel reads, -1 terminated (from the rewrite)
};
inline std::map<std::string, Kernel>& registry() {
  static std::map<std::string, Kernel> r;
  return r;
}
struct Registrar {
  Registrar(const char* name, KernelFn f, const int* buffers) { registry()[name] = Kernel{f, buffers}; }
};

template <typename T>
T bind(const Bindings& b, int k) {
  // dispatch() checked that every buffer the kernel reads is set
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<T>(b.buf[k]);
  } else {
    static_assert(std::is_reference_v<T>, "a [[buffer(k)]] parameter is a pointer or a reference");
    return *reinterpret_cast<std::remove_reference_t<T>*>(b.buf[k]);
  }
}

// ---- built-in positions (x only) -------------------------------------------------------------
template <typename T> T thread_position_in_threadgroup() { return static_cast<T>(::threadIdx.x); }
template <typename T> T threadgroup_position_in_grid() { return static_cast<T>(::blockIdx.x); }
template <typename T> T threads_per_threadgroup() { return static_cast<T>(::blockDim.x); }
template <typename T> T threadgroups_per_grid() { return static_cast<T>(::gridDim.x); }
template <typename T> T thread_position_in_grid() { return static_cast<T>(::blockIdx.x * ::blockDim.x + ::threadIdx.x); }
template <typename T> T thread_index_in_simdgroup() { return static_cast<T>(::threadIdx.x % 32u); }
template <typename T> T simdgroup_index_in_threadgroup() { return static_cast<T>(::threadIdx.x / 32u); }
template <typename T> T threads_per_simdgroup() { return static_cast<T>(32); }
template <typename T> T simdgroups_per_threadgroup() { return static_cast<T>((::blockDim.x + 31u) / 32u); }

// ---- threadgroup memory ----------------------------------------------------------------------
// One block of storage per `threadgroup` declaration (keyed by file and line), new for every
// threadgroup of every dispatch and filled with seeded garbage, like uninitialised GPU memory.
struct TgState {
  uint64_t launch = 0, epoch_launch = ~uint64_t(0);
  unsigned bx = ~0u, by = ~0u, bz = ~0u;
  std::map<std::pair<const char*, int>, std::string> vars;  // std::string as a byte buffer
};
inline TgState& tg() {
  static TgState t;
  return t;
}
template <typename T>
T& tg_var(const char* file, int line) {
  static_assert(std::is_trivially_copyable_v<T>, "threadgroup variables must be trivially copyable");
  TgState& t = tg();
  if (t.epoch_launch != t.launch || t.bx != ::blockIdx.x || t.by != ::blockIdx.y || t.bz != ::blockIdx.z) {
    t.vars.clear();
    t.epoch_launch = t.launch;
    t.bx = ::blockIdx.x;
    t.by = ::blockIdx.y;
    t.bz = ::blockIdx.z;
  }
  auto key = std::make_pair(file, line);
  auto it = t.vars.find(key);
  if (it == t.vars.end()) {
    std::string bytes(sizeof(T) + alignof(std::max_align_t), '\0');
    for (auto& c : bytes) c = static_cast<char>(S().rng());
    it = t.vars.emplace(key, std::move(bytes)).first;
  }
  void* p = it->second.data();
  size_t space = it->second.size();
  return *reinterpret_cast<T*>(std::align(alignof(std::max_align_t), sizeof(T), p, space));
}

// ---- dispatch --------------------------------------------------------------------------------
// dispatch_threadgroups(grid, group): grid threadgroups of `group` threads (1-D). Returns "" on
// success, else the error (invalid configuration or what the scheduler reported).
inline std::string dispatch(const std::string& name, const Bindings& b, unsigned groups, unsigned threads) {
  auto it = registry().find(name);
  if (it == registry().end()) return "no kernel named " + name;
  for (const int* k = it->second.buffers; *k >= 0; ++k) {
    if (*k >= Bindings::kMax || !b.buf[*k]) return name + ": buffer " + std::to_string(*k) + " is read but was not set";
  }
  if (threads == 0 || threads > 1024 || groups == 0) {
    return "invalid dispatch: " + std::to_string(groups) + " threadgroups of " + std::to_string(threads) + " threads";
  }
  tg().launch++;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(groups);
  cfg.blockDim = dim3(threads);
  const cudaError_t e = redrafter_emu::launch<const Bindings&>(cfg, it->second.fn, std::tuple<const Bindings&>(b));
  (void)cudaGetLastError();
  if (e != cudaSuccess) return name + ": " + redrafter_emu::emu_error();
  return "";
}

// ---- simd collectives over the scheduler's per-warp exchange ---------------------------------
template <typename T>
T shuffle(Op op, const char* file, int line, T v, int arg) {
  return redrafter_emu::shfl(op, file, line, 0xffffffffu, v, arg, 32);
}
template <typename T>
T sum(const char* file, int line, T v) {
  for (int m = 16; m > 0; m >>= 1) v = v + shuffle(Op::ShflXor, file, line, v, m);
  return v;
}
template <typename T>
T vmax(const char* file, int line, T v) {
  for (int m = 16; m > 0; m >>= 1) {
    const T o = shuffle(Op::ShflXor, file, line, v, m);
    v = o > v ? o : v;
  }
  return v;
}
template <typename T>
T vmin(const char* file, int line, T v) {
  for (int m = 16; m > 0; m >>= 1) {
    const T o = shuffle(Op::ShflXor, file, line, v, m);
    v = o < v ? o : v;
  }
  return v;
}
template <typename T>
T prefix_inclusive(const char* file, int line, T v) {
  const unsigned lane = ::threadIdx.x % 32u;
  for (unsigned d = 1; d < 32; d <<= 1) {
    const T o = shuffle(Op::ShflUp, file, line, v, static_cast<int>(d));
    if (lane >= d) v = v + o;
  }
  return v;
}
template <typename T>
T prefix_exclusive(const char* file, int line, T v) {
  return prefix_inclusive(file, line, v) - v;
}
inline uint64_t ballot(const char* file, int line, bool p) {
  return redrafter_emu::wait_at(Op::Ballot, file, line, 0xffffffffu, p, 0, 32);
}

}  // namespace mtl_emu

// ---- MSL vocabulary ----------------------------------------------------------------------------
using uint = unsigned int;
using ushort = unsigned short;
using uchar = unsigned char;
using ulong = unsigned long;
// uint2 and uint4 come from cuda_shim.h (8- and 16-byte aligned x, y[, z, w] members)

// IEEE half as storage, converted to float exactly.
struct half {
  uint16_t bits;
  operator float() const {
    const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
    const uint32_t ex = (bits >> 10) & 0x1fu;
    uint32_t mant = bits & 0x3ffu;
    uint32_t u;
    if (ex == 0x1f) {
      u = sign | 0x7f800000u | (mant << 13);
    } else if (ex != 0) {
      u = sign | ((ex + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      u = sign;
    } else {
      int e = 113;
      while (!(mant & 0x400u)) {
        mant <<= 1;
        --e;
      }
      u = sign | (uint32_t(e) << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
enum memory_order { memory_order_relaxed };

template <typename T, typename F>
T as_type(F x) {
  static_assert(sizeof(T) == sizeof(F), "as_type between types of different sizes");
  T t;
  std::memcpy(&t, &x, sizeof(T));
  return t;
}
template <typename T> T max(T a, T b) { return a > b ? a : b; }
template <typename T> T min(T a, T b) { return a < b ? a : b; }
template <typename T> T clamp(T x, T lo, T hi) { return x < lo ? lo : (x > hi ? hi : x); }
namespace precise {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
inline float sqrt(float x) { return std::sqrt(x); }
}  // namespace precise

template <typename T>
struct atomic {
  T v;
};
using atomic_uint = atomic<uint>;
using atomic_int = atomic<int>;
template <typename T> void atomic_store_explicit(atomic<T>* a, T x, memory_order) { std::atomic_ref<T>(a->v).store(x); }
template <typename T> T atomic_load_explicit(atomic<T>* a, memory_order) { return std::atomic_ref<T>(a->v).load(); }
template <typename T> T atomic_fetch_add_explicit(atomic<T>* a, T x, memory_order) {
  return std::atomic_ref<T>(a->v).fetch_add(x);
}
template <typename T> T atomic_fetch_sub_explicit(atomic<T>* a, T x, memory_order) {
  return std::atomic_ref<T>(a->v).fetch_sub(x);
}
template <typename T> T atomic_fetch_or_explicit(atomic<T>* a, T x, memory_order) {
  return std::atomic_ref<T>(a->v).fetch_or(x);
}
template <typename T> T atomic_fetch_max_explicit(atomic<T>* a, T x, memory_order) { return ::atomicMax(&a->v, x); }
template <typename T> T atomic_fetch_min_explicit(atomic<T>* a, T x, memory_order) { return ::atomicMin(&a->v, x); }

struct simd_vote {
  using vote_t = uint64_t;
  vote_t bits;
  explicit operator vote_t() const { return bits; }
  bool any() const { return bits != 0; }
  bool all() const { return bits == 0xffffffffu; }
};
}  // namespace metal

// Collectives and barriers are macros so that the scheduler knows their source line (divergent
// barriers are reported by line).
#define threadgroup_barrier(flags) \
  ((void)(flags), (void)::redrafter_emu::wait_at(::redrafter_emu::Op::Barrier, __FILE__, __LINE__, 0, 0, 0, 32))
#define simdgroup_barrier(flags) ((void)(flags), ::redrafter_emu::syncwarp(__FILE__, __LINE__))
#define simd_shuffle(v, l) ::mtl_emu::shuffle(::redrafter_emu::Op::Shfl, __FILE__, __LINE__, (v), static_cast<int>(l))
#define simd_broadcast(v, l) simd_shuffle(v, l)
#define simd_shuffle_xor(v, m) \
  ::mtl_emu::shuffle(::redrafter_emu::Op::ShflXor, __FILE__, __LINE__, (v), static_cast<int>(m))
#define simd_shuffle_up(v, d) \
  ::mtl_emu::shuffle(::redrafter_emu::Op::ShflUp, __FILE__, __LINE__, (v), static_cast<int>(d))
#define simd_shuffle_down(v, d) \
  ::mtl_emu::shuffle(::redrafter_emu::Op::ShflDown, __FILE__, __LINE__, (v), static_cast<int>(d))
#define simd_sum(v) ::mtl_emu::sum(__FILE__, __LINE__, (v))
#define simd_max(v) ::mtl_emu::vmax(__FILE__, __LINE__, (v))
#define simd_min(v) ::mtl_emu::vmin(__FILE__, __LINE__, (v))
#define simd_prefix_inclusive_sum(v) ::mtl_emu::prefix_inclusive(__FILE__, __LINE__, (v))
#define simd_prefix_exclusive_sum(v) ::mtl_emu::prefix_exclusive(__FILE__, __LINE__, (v))
#define simd_ballot(p) (::metal::simd_vote{::mtl_emu::ballot(__FILE__, __LINE__, (p))})
#define simd_any(p) (::mtl_emu::ballot(__FILE__, __LINE__, (p)) != 0)
#define simd_all(p) (::mtl_emu::ballot(__FILE__, __LINE__, (p)) == 0xffffffffu)

// Address-space qualifiers and the kernel keyword mean nothing on the host.
#define device
#define constant
#define thread
#define threadgroup
#define kernel
