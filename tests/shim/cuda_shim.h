// Host emulation of the CUDA subset our kernels use, so that csrc/cuda/*.cu compile with g++ and
// run on the CPU under test (tests/test_cuda_emulated.py). Compile a .cu with
//   g++ -std=c++20 -x c++ -DREDRAFTER_EMULATE -I tests/shim -I csrc file.cu
// (tests/shim/cuda_runtime.h forwards here, so `#include <cuda_runtime.h>` lands in this file).
//
// Model. Blocks of a grid run one after another. The threads of a block are fibers (ucontext)
// that run until they reach a synchronisation point: __syncthreads, a warp collective
// (__shfl*_sync, __ballot_sync, __any_sync, __all_sync, __syncwarp) or their end. The next fiber
// to run is drawn at random from the runnable ones (seeded: set_seed), so a kernel that reads
// shared memory another thread writes without a barrier in between sees either value depending on
// the seed. Dynamic shared memory (dynamic_smem<T>(), the only kind allowed: a static __shared__
// declaration does not compile) is filled with seeded garbage before each block.
//
// Reported as launch errors (cudaErrorLaunchFailure + emu_error() text): a thread that exits or
// waits at a different barrier while others wait at __syncthreads, barriers reached from different
// source lines, a warp collective whose mask names an exited lane, a lane outside it, or lanes
// doing different collectives, a shuffle from a lane that does not take part, deadlocks, and
// launch configurations CUDA would reject (block > 1024 threads, > 48 KiB dynamic shared memory
// without cudaFuncSetAttribute, > 227 KiB at all).
//
// Not modelled: the GPU memory model (every access is sequentially consistent), timing,
// occupancy, bank conflicts, fast-math. Not thread safe: one launch at a time per process.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define REDRAFTER_EMU_ASAN 1
#endif

// ---- keywords -------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __align__(n) alignas(n)
#define __launch_bounds__(...)
#define __shared__ \
  static_assert(false, "static __shared__ is not supported by the emulator: use dynamic_smem<T>()");

// ---- runtime types --------------------------------------------------------------------------
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
using uint3 = dim3;
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
typedef struct CUstream_st* cudaStream_t;
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
struct cudaLaunchAttribute;
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned int numAttrs;
};
constexpr int warpSize = 32;
// Built-in variables: plain globals; the scheduler sets threadIdx before it resumes a fiber.
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

namespace redrafter_emu {

enum class Op { None, Barrier, Shfl, ShflUp, ShflDown, ShflXor, Ballot, Any, All, SyncWarp };
enum class St { Ready, Waiting, Done };

// Context switch. x86-64: a minimal switch of the callee-saved registers, MXCSR and the x87 control
// word (ucontext's swapcontext makes two sigprocmask system calls per switch: ~5x slower).
// Elsewhere: ucontext.
#if defined(__x86_64__)
#define REDRAFTER_EMU_ASM_SWITCH 1
extern "C" void redrafter_emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .weak redrafter_emu_switch
  .type redrafter_emu_switch,@function
redrafter_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size redrafter_emu_switch, .-redrafter_emu_switch
)");
#endif

struct Fiber {
  ucontext_t ctx;
  void* sp = nullptr;
  char* stack = nullptr;
  unsigned tid = 0;  // linear thread index in the block
  dim3 idx;
  St st = St::Ready;
  Op op = Op::None;  // what it waits at
  const char* file = "";
  int line = 0;
  unsigned mask = 0;
  int arg = 0, width = 32;
  uint64_t val = 0, result = 0;
  void* fake = nullptr;  // ASan fake stack while switched out
};

// Global-memory traffic of launches, counted while enabled (traffic_start .. traffic_stop) through
// the kernels' access helpers (ld_global / st_global in csrc/cuda/common.cuh): bytes per access
// width and per named region (an input or output buffer registered by the test bindings), and the
// blocks run. With a sample stride > 1 only blocks whose blockIdx.x is a multiple of it run (the
// same rows in every launch of an op whose grids put rows on x): a cost estimate for shapes too
// large to emulate whole; the outputs are then not meaningful.
struct TrafficRegion {
  std::string name;
  uintptr_t lo = 0, hi = 0;
};
struct TrafficLaunch {
  std::string name;
  dim3 grid, block;
  size_t smem = 0;
  uint64_t blocks_total = 0, blocks_run = 0;
  uint64_t read_by_width[5] = {}, write_by_width[5] = {};  // widths 1, 2, 4, 8, 16 bytes
  std::vector<uint64_t> region_read, region_write;         // per region; last entry: unregistered
};
struct Traffic {
  bool on = false;
  uint64_t sample = 1;
  std::vector<TrafficRegion> regions;
  std::vector<TrafficLaunch> launches;
  const char* next_name = nullptr;  // set by launch_kernel's named overload
};

struct State {
  Traffic traffic;
  uint64_t seed = 0;
  std::mt19937_64 rng;
  size_t stack_bytes = size_t(1) << 18;
  std::vector<char*> stacks;
  std::vector<Fiber> fibers;
  std::vector<Fiber*> ready;  // runnable fibers
  std::vector<unsigned char> smem;
  std::map<const void*, size_t> max_smem;  // cudaFuncSetAttribute
  ucontext_t sched;
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  std::function<void()> body;
  std::string error;  // first error of the last failing launch
  cudaError_t last = cudaSuccess;
  bool failed = false;
  // ASan fiber bookkeeping; declared in every build so that the layout is the same in sanitized
  // and plain translation units (the test module mixes them)
  const void* sched_bottom = nullptr;
  size_t sched_size = 0;
};
inline State& S() {
  static State s;
  return s;
}

// ---- API for the tests ----------------------------------------------------------------------
inline void set_seed(uint64_t seed) {
  S().seed = seed;
  S().rng.seed(seed);
}
inline const std::string& emu_error() { return S().error; }

inline void fail(const std::string& msg) {
  if (!S().failed) S().error = msg;
  S().failed = true;
}

inline void traffic_start(uint64_t sample) {
  Traffic& t = S().traffic;
  t = Traffic{};
  t.on = true;
  t.sample = sample < 1 ? 1 : sample;
}
inline void traffic_region(const std::string& name, const void* p, size_t bytes) {
  if (!S().traffic.on || bytes == 0) return;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p);
  S().traffic.regions.push_back({name, lo, lo + bytes});
}
inline Traffic traffic_stop() {
  Traffic t = std::move(S().traffic);
  S().traffic = Traffic{};
  return t;
}
inline void traffic_name_next(const char* name) { S().traffic.next_name = name; }

// One global access of `bytes` at p by the current thread: a misaligned access is an error (the GPU
// faults on it), and while counting, its bytes go to the current launch.
inline void global_access(const void* p, size_t bytes, size_t align, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % align) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "misaligned %zu-byte global %s at %p", bytes, write ? "store" : "load", p);
    fail(buf);
    return;
  }
  Traffic& t = S().traffic;
  if (!t.on || t.launches.empty()) return;
  TrafficLaunch& l = t.launches.back();
  const int w = bytes >= 16 ? 4 : bytes >= 8 ? 3 : bytes >= 4 ? 2 : bytes >= 2 ? 1 : 0;
  (write ? l.write_by_width : l.read_by_width)[w] += bytes;
  size_t r = 0;
  while (r < t.regions.size() && !(a >= t.regions[r].lo && a < t.regions[r].hi)) ++r;
  (write ? l.region_write : l.region_read)[r] += bytes;
}

// ---- fiber switching ------------------------------------------------------------------------
inline void switch_to_scheduler(bool exiting) {
  State& s = S();
  Fiber* f = s.cur;
#ifdef REDRAFTER_EMU_ASAN
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f->fake, s.sched_bottom, s.sched_size);
#else
  (void)exiting;
#endif
#ifdef REDRAFTER_EMU_ASM_SWITCH
  redrafter_emu_switch(&f->sp, s.sched_sp);
#else
  swapcontext(&f->ctx, &s.sched);
#endif
#ifdef REDRAFTER_EMU_ASAN
  __sanitizer_finish_switch_fiber(f->fake, nullptr, nullptr);
#endif
}

inline void fiber_entry() {
#ifdef REDRAFTER_EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &S().sched_bottom, &S().sched_size);
#endif
  S().body();
  S().cur->st = St::Done;
  switch_to_scheduler(true);
}

inline void run_fiber(Fiber* f) {
  State& s = S();
  s.cur = f;
  ::threadIdx = f->idx;
#ifdef REDRAFTER_EMU_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack, s.stack_bytes);
#endif
#ifdef REDRAFTER_EMU_ASM_SWITCH
  redrafter_emu_switch(&s.sched_sp, f->sp);
#else
  swapcontext(&s.sched, &f->ctx);
#endif
#ifdef REDRAFTER_EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  s.cur = nullptr;
}

inline std::string where(const Fiber& f) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "thread (%u,%u,%u) of block (%u,%u,%u)", f.idx.x, f.idx.y, f.idx.z,
                ::blockIdx.x, ::blockIdx.y, ::blockIdx.z);
  return buf;
}

// ---- resolution of barriers and warp collectives ---------------------------------------------
// Completes the collective that `first` (a lane of warp lanes[]) waits at when every lane of its
// mask waits there too. Returns whether it did; reports divergence as an error.
inline bool try_group(Fiber* const* lanes, Fiber* first) {
  const unsigned mask = first->mask;
  if (!(mask >> (first->tid % 32) & 1)) {
    fail("warp collective called by a lane outside its mask: " + where(*first));
    return false;
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(mask >> l & 1)) continue;
    Fiber* f = lanes[l];
    if (!f) {
      fail("warp collective mask names lane " + std::to_string(l) + " beyond the block: " + where(*first));
      return false;
    }
    if (f->st == St::Done) {
      fail("warp collective waits for lane " + std::to_string(l) + ", which has exited: " + where(*first));
      return false;
    }
    if (f->st != St::Waiting || f->op == Op::Barrier) return false;  // not there yet
    if (f->op != first->op || f->mask != mask || f->width != first->width) {
      fail("divergent warp collectives (different operations or masks) at " + std::string(f->file) + ":" +
           std::to_string(f->line) + " and " + first->file + ":" + std::to_string(first->line));
      return false;
    }
  }
  uint64_t bits = 0;
  for (unsigned l = 0; l < 32; ++l) {
    if ((mask >> l & 1) && lanes[l]->val) bits |= uint64_t(1) << l;
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (!(mask >> l & 1)) continue;
    Fiber* f = lanes[l];
    const int width = f->width, lane = static_cast<int>(l), seg = lane & ~(width - 1);
    int src = lane;
    switch (f->op) {
      case Op::Shfl: src = seg + (f->arg & (width - 1)); break;
      case Op::ShflUp: src = lane - seg >= f->arg ? lane - f->arg : lane; break;
      case Op::ShflDown: src = lane - seg + f->arg < width ? lane + f->arg : lane; break;
      case Op::ShflXor: src = lane ^ f->arg; src = src < seg + width ? src : lane; break;
      case Op::Ballot: f->result = bits; break;
      case Op::Any: f->result = bits != 0; break;
      case Op::All: f->result = bits == mask; break;
      default: break;
    }
    if (f->op == Op::Shfl || f->op == Op::ShflUp || f->op == Op::ShflDown || f->op == Op::ShflXor) {
      if (src < 0 || src >= 32 || !(mask >> src & 1)) {
        fail("shuffle reads lane " + std::to_string(src) + ", which does not take part: " + where(*f));
        return false;
      }
      f->result = lanes[src]->val;
    }
  }
  for (unsigned l = 0; l < 32; ++l) {
    if (mask >> l & 1) {
      lanes[l]->st = St::Ready;
      S().ready.push_back(lanes[l]);
    }
  }
  return true;
}

// Completes whatever collectives of warp w can complete; returns whether any did.
inline bool try_warp(unsigned w) {
  State& s = S();
  const unsigned n = static_cast<unsigned>(s.fibers.size());
  Fiber* lanes[32] = {};
  for (unsigned l = 0; l < 32 && w * 32 + l < n; ++l) lanes[l] = &s.fibers[w * 32 + l];
  bool any = false;
  for (unsigned l = 0; l < 32 && !s.failed; ++l) {
    Fiber* f = lanes[l];
    if (f && f->st == St::Waiting && f->op != Op::Barrier && f->op != Op::None) any |= try_group(lanes, f);
  }
  return any;
}

// Releases __syncthreads when every live thread waits at it. Returns whether it did.
inline bool try_barrier() {
  State& s = S();
  Fiber* first = nullptr;
  unsigned done = 0;
  for (Fiber& f : s.fibers) {
    if (f.st == St::Done) {
      ++done;
    } else if (f.st != St::Waiting || f.op != Op::Barrier) {
      return false;
    } else if (!first) {
      first = &f;
    }
  }
  if (!first) return false;
  if (done > 0) {
    fail("__syncthreads at " + std::string(first->file) + ":" + std::to_string(first->line) + " waits for " +
         std::to_string(done) + " thread(s) that exited (divergent barrier): " + where(*first));
    return false;
  }
  uint64_t count = 0;
  for (Fiber& f : s.fibers) {
    if (f.line != first->line || std::strcmp(f.file, first->file) != 0) {
      fail("threads wait at different __syncthreads (" + std::string(first->file) + ":" +
           std::to_string(first->line) + " and " + f.file + ":" + std::to_string(f.line) + ")");
      return false;
    }
    count += f.val != 0;
  }
  for (Fiber& f : s.fibers) {
    f.result = count;
    f.st = St::Ready;
    s.ready.push_back(&f);
  }
  return true;
}

// Called by a fiber: wait at a synchronisation point, return its result.
inline uint64_t wait_at(Op op, const char* file, int line, unsigned mask, uint64_t val, int arg, int width) {
  Fiber* f = S().cur;
  f->op = op;
  f->file = file;
  f->line = line;
  f->mask = mask;
  f->val = val;
  f->arg = arg;
  f->width = width;
  f->st = St::Waiting;
  switch_to_scheduler(false);
  return f->result;
}

// Runs one block: every thread to completion, in a seeded random order between sync points.
inline void run_block() {
  State& s = S();
  s.ready.clear();
  for (Fiber& f : s.fibers) s.ready.push_back(&f);
  while (!s.failed) {
    if (s.ready.empty()) {
      bool waiting = false;
      for (Fiber& f : s.fibers) waiting |= f.st == St::Waiting;
      if (!waiting) return;  // all done
      bool progress = try_barrier();
      for (unsigned w = 0; !s.failed && w * 32 < s.fibers.size(); ++w) progress |= try_warp(w);
      if (!progress && !s.failed) {
        for (Fiber& f : s.fibers) {
          if (f.st == St::Waiting) {
            fail("deadlock: " + where(f) + " waits at " + f.file + ":" + std::to_string(f.line) +
                 (f.op == Op::Barrier ? " (__syncthreads)" : " (warp collective)") +
                 " and nothing else can run (divergent barrier or collective)");
            break;
          }
        }
      }
      continue;
    }
    const size_t k = s.rng() % s.ready.size();
    Fiber* f = s.ready[k];
    s.ready[k] = s.ready.back();
    s.ready.pop_back();
    f->st = St::Waiting;  // overwritten by the fiber when it blocks or exits
    f->op = Op::None;
    run_fiber(f);
    if (f->st == St::Waiting && f->op == Op::None) fail("internal: fiber returned without waiting");
    if (f->st == St::Waiting && f->op != Op::Barrier && f->op != Op::None) try_warp(f->tid / 32);
  }
}

// A fresh fiber for thread t of the block (outside launch's loops: getcontext there upsets
// -Wclobbered).
__attribute__((noinline)) inline void init_fiber(Fiber& f, unsigned t, const dim3& b, char* stack, size_t bytes) {
  f.tid = t;
  f.idx = dim3(t % b.x, (t / b.x) % b.y, t / (b.x * b.y));
  f.stack = stack;
#ifdef REDRAFTER_EMU_ASAN
  // the stack may hold the poisoned frames of a fiber abandoned by a failed launch
  __asan_unpoison_memory_region(stack, bytes);
#endif
#ifdef REDRAFTER_EMU_ASM_SWITCH
  // initial frame popped by redrafter_emu_switch: MXCSR/x87 word, 6 registers, then "return" into
  // fiber_entry with the stack aligned as after a call
  uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                           // fake return address of fiber_entry
  *--sp = reinterpret_cast<uint64_t>(&fiber_entry);  // popped by ret
  for (int i = 0; i < 6; ++i) *--sp = 0;              // rbp rbx r12-r15
  --sp;
  __asm__ volatile("stmxcsr (%0)\n\tfnstcw 4(%0)" : : "r"(sp) : "memory");
  f.sp = sp;
  return;
#endif
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = stack;
  f.ctx.uc_stack.ss_size = bytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_entry, 0);
}

template <typename... KArgs>
cudaError_t launch(const cudaLaunchConfig_t& cfg, void (*kernel)(KArgs...), std::tuple<KArgs...> args) {
  State& s = S();
  const dim3 g = cfg.gridDim, b = cfg.blockDim;
  const uint64_t nthreads = uint64_t(b.x) * b.y * b.z;
  s.failed = false;
  s.error.clear();
  const auto it = s.max_smem.find(reinterpret_cast<const void*>(kernel));
  const size_t smem_limit = it == s.max_smem.end() ? 48 * 1024 : it->second;
  if (nthreads == 0 || nthreads > 1024 || b.z > 64 || g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 ||
      g.z > 65535 || g.x > 0x7fffffffu || cfg.dynamicSmemBytes > smem_limit) {
    s.error = "invalid launch configuration (block " + std::to_string(nthreads) + " threads, " +
              std::to_string(cfg.dynamicSmemBytes) + " B dynamic shared memory, limit " +
              std::to_string(smem_limit) + ")";
    return s.last = cudaErrorInvalidConfiguration;
  }
  const size_t stack = s.stack_bytes;
  while (s.stacks.size() < nthreads) s.stacks.push_back(static_cast<char*>(std::malloc(stack)));
  ::blockDim = b;
  ::gridDim = g;
  s.body = [&] { std::apply(kernel, args); };
  s.smem.assign(cfg.dynamicSmemBytes + 16, 0);
  Traffic& tr = s.traffic;
  if (tr.on) {
    TrafficLaunch l;
    l.name = tr.next_name ? tr.next_name : "kernel";
    l.grid = g;
    l.block = b;
    l.smem = cfg.dynamicSmemBytes;
    l.blocks_total = uint64_t(g.x) * g.y * g.z;
    l.region_read.assign(tr.regions.size() + 1, 0);
    l.region_write.assign(tr.regions.size() + 1, 0);
    tr.launches.push_back(std::move(l));
  }
  tr.next_name = nullptr;
  for (unsigned bz = 0; bz < g.z; ++bz)
    for (unsigned by = 0; by < g.y; ++by)
      for (unsigned bx = 0; bx < g.x; ++bx) {
        if (tr.on && bx % tr.sample != 0) continue;
        if (tr.on) ++tr.launches.back().blocks_run;
        ::blockIdx = dim3(bx, by, bz);
        for (auto& c : s.smem) c = static_cast<unsigned char>(s.rng());  // garbage
        s.fibers.assign(nthreads, Fiber{});
        for (unsigned t = 0; t < nthreads; ++t) init_fiber(s.fibers[t], t, b, s.stacks[t], stack);
        run_block();
        if (s.failed) {
          char buf[96];
          std::snprintf(buf, sizeof buf, " [block (%u,%u,%u), seed %llu]", bx, by, bz,
                        static_cast<unsigned long long>(s.seed));
          s.error += buf;
          return s.last = cudaErrorLaunchFailure;
        }
      }
  return cudaSuccess;
}

inline unsigned char* smem() { return S().smem.data(); }  // 16-byte aligned: std::vector's allocator

}  // namespace redrafter_emu


// ---- synchronisation and warp collectives ---------------------------------------------------
#define __syncthreads() \
  ((void)::redrafter_emu::wait_at(::redrafter_emu::Op::Barrier, __FILE__, __LINE__, 0, 0, 0, 32))
#define __syncthreads_count(p) \
  (static_cast<int>(::redrafter_emu::wait_at(::redrafter_emu::Op::Barrier, __FILE__, __LINE__, 0, (p) != 0, 0, 32)))
#define __syncthreads_or(p) (__syncthreads_count(p) != 0)
#define __syncwarp(...) ::redrafter_emu::syncwarp(__FILE__, __LINE__, ##__VA_ARGS__)
#define __ballot_sync(m, p) \
  (static_cast<unsigned>(::redrafter_emu::wait_at(::redrafter_emu::Op::Ballot, __FILE__, __LINE__, (m), (p) != 0, 0, 32)))
#define __any_sync(m, p) \
  (static_cast<int>(::redrafter_emu::wait_at(::redrafter_emu::Op::Any, __FILE__, __LINE__, (m), (p) != 0, 0, 32)))
#define __all_sync(m, p) \
  (static_cast<int>(::redrafter_emu::wait_at(::redrafter_emu::Op::All, __FILE__, __LINE__, (m), (p) != 0, 0, 32)))
#define __shfl_sync(m, v, l, ...) ::redrafter_emu::shfl(::redrafter_emu::Op::Shfl, __FILE__, __LINE__, (m), (v), (l), ##__VA_ARGS__)
#define __shfl_up_sync(m, v, d, ...) ::redrafter_emu::shfl(::redrafter_emu::Op::ShflUp, __FILE__, __LINE__, (m), (v), (d), ##__VA_ARGS__)
#define __shfl_down_sync(m, v, d, ...) ::redrafter_emu::shfl(::redrafter_emu::Op::ShflDown, __FILE__, __LINE__, (m), (v), (d), ##__VA_ARGS__)
#define __shfl_xor_sync(m, v, x, ...) ::redrafter_emu::shfl(::redrafter_emu::Op::ShflXor, __FILE__, __LINE__, (m), (v), (x), ##__VA_ARGS__)

namespace redrafter_emu {
inline void syncwarp(const char* file, int line, unsigned mask = 0xffffffffu) {
  wait_at(Op::SyncWarp, file, line, mask, 0, 0, 32);
}
template <typename T>
T shfl(Op op, const char* file, int line, unsigned mask, T v, int arg, int width = 32) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1))) fail("shuffle width must be a power of two <= 32");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  const uint64_t r = wait_at(op, file, line, mask, bits, arg, width);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}
}  // namespace redrafter_emu

// ---- device functions -----------------------------------------------------------------------
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(unsigned x) { return x ? __builtin_clz(x) : 32; }
inline int __ffs(unsigned x) { return __builtin_ffs(static_cast<int>(x)); }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
template <typename T> T __ldg(const T* p) { return *p; }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T> T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v); }
template <typename T> T atomicSub(T* p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v); }
template <typename T> T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v); }
template <typename T> T atomicAnd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_and(v); }
template <typename T> T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v); }
template <typename T> T atomicCAS(T* p, T cmp, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v);
  return cmp;
}
template <typename T> T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {}
  return old;
}
template <typename T> T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {}
  return old;
}

// ---- runtime API --------------------------------------------------------------------------------
template <typename... KArgs, typename... Args>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*kernel)(KArgs...), Args&&... args) {
  return ::redrafter_emu::launch(*cfg, kernel, std::tuple<KArgs...>(static_cast<KArgs>(args)...));
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
    return cudaErrorInvalidValue;
  ::redrafter_emu::S().max_smem[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  const cudaError_t e = ::redrafter_emu::S().last;
  ::redrafter_emu::S().last = cudaSuccess;
  return e;
}
inline cudaError_t cudaPeekAtLastError() { return ::redrafter_emu::S().last; }
inline const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}
