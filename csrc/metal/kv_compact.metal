// kv_compact, in place: for each row b and i = 0..accept_len[b], copy slot cache_len[b] +
// path_nodes[b, i] to slot cache_len[b] + i in every layer, K and V; then cache_len[b] +=
// accept_len[b] + 1 (accept_len == -1: inactive row, nothing happens).
//
// Kernels:
//   kv_compact_<n> (n = 16, 8, 4, 2, 1: bytes per vector unit; the host picks the largest that
//                  divides the slot size and the buffer offset)
//     buffer(0) kv [n_layers * 2 * B * H, S, vecs] units of n bytes (in/out)
//     buffer(1) cache_len [B] int32   buffer(2) path_nodes [B, L] int32   buffer(3) accept_len [B] int32
//     buffer(4) KvCompactParams {units, B, H, S, vecs, L}
//     Grid: min(ceil(units * vecs / 256), 65535) threadgroups of 256 threads (grid-stride loop).
//   kv_compact_advance   buffer(0) cache_len [B] int32 (in/out)   buffer(1) path_nodes   buffer(2) accept_len
//                buffer(3) KvCompactParams. Grid: ceil(B / 256) threadgroups of 256 threads.
//                Encoded after kv_compact_<n> (which reads cache_len).
//   kv_copy_<n>  buffer(0) src [count] units of n bytes   buffer(1) dst [count] (out)
//                buffer(2) uint count. Grid: min(ceil(count / 256), 65535) threadgroups of 256
//                threads (grid-stride). The host copies kv / cache_len into fresh outputs with it
//                when MLX cannot donate the input buffers to the in-place op.
// Thread g owns one vector column c of one (layer, K/V, row, head) unit u: it gathers the column
// of the accepted sources (16 at a time in registers) and then scatters them, so no two threads
// touch the same bytes and, since path_nodes[i] >= i, a source is never a destination of an
// earlier chunk. A row with any out-of-range value (accept_len outside [-1, L-1], cache_len
// outside [0, S], path_nodes[i] < i or cache_len + path_nodes[i] >= S) is left untouched,
// cache_len included (the host does not read values: that would synchronise).
#include "common.h"

constant constexpr int kChunk = 16;

// accept_len of an active row whose values are all in range, else -1 (the row is left untouched)
inline long checked_accept(device const int* cache_len, device const int* path, device const int* acc, long b,
                           constant KvCompactParams& p) {
  const long a = acc[b];
  if (a < 0 || a >= p.L) return -1;
  const long c = cache_len[b];
  if (c < 0 || c > p.S) return -1;
  for (long i = 0; i <= a; ++i) {
    const long q = path[b * p.L + i];
    if (q < i || c + q >= p.S) return -1;
  }
  return a;
}

template <typename Vec>
[[kernel]] void kv_compact(device Vec* kv [[buffer(0)]],
                           device const int* cache_len [[buffer(1)]],
                           device const int* path_nodes [[buffer(2)]],
                           device const int* accept_len [[buffer(3)]],
                           constant KvCompactParams& p [[buffer(4)]],
                           uint gid [[thread_position_in_grid]],
                           uint n_groups [[threadgroups_per_grid]],
                           uint nthreads [[threads_per_threadgroup]]) {
  const long vecs = p.vecs, total = long(p.units) * vecs;
  const long stride = long(n_groups) * long(nthreads);
  for (long g = gid; g < total; g += stride) {
    const long u = g / vecs, c = g % vecs;
    const long b = (u / p.H) % p.B;
    const long a = checked_accept(cache_len, path_nodes, accept_len, b, p);
    if (a < 0) continue;
    device Vec* base = kv + (u * p.S + cache_len[b]) * vecs + c;
    device const int* path = path_nodes + b * p.L;
    for (long i0 = 0; i0 <= a; i0 += kChunk) {
      Vec r[kChunk];
      for (int k = 0; k < kChunk; ++k) {
        if (i0 + k <= a) r[k] = base[long(path[i0 + k]) * vecs];
      }
      for (int k = 0; k < kChunk; ++k) {
        const long i = i0 + k;
        if (i <= a && long(path[i]) != i) base[i * vecs] = r[k];
      }
    }
  }
}

[[kernel]] void kv_compact_advance(device int* cache_len [[buffer(0)]],
                           device const int* path_nodes [[buffer(1)]],
                           device const int* accept_len [[buffer(2)]],
                           constant KvCompactParams& p [[buffer(3)]],
                           uint gid [[thread_position_in_grid]]) {
  const long b = gid;
  if (b >= p.B) return;
  const long a = checked_accept(cache_len, path_nodes, accept_len, b, p);
  if (a >= 0) cache_len[b] += int(a + 1);
}

template <typename Vec>
[[kernel]] void kv_copy(device const Vec* src [[buffer(0)]],
                        device Vec* dst [[buffer(1)]],
                        constant uint& count [[buffer(2)]],
                        uint gid [[thread_position_in_grid]],
                        uint n_groups [[threadgroups_per_grid]],
                        uint nthreads [[threads_per_threadgroup]]) {
  for (ulong i = gid; i < count; i += ulong(n_groups) * nthreads) dst[i] = src[i];
}

instantiate_kernel("kv_compact_16", kv_compact, uint4)
instantiate_kernel("kv_compact_8", kv_compact, uint2)
instantiate_kernel("kv_compact_4", kv_compact, uint)
instantiate_kernel("kv_compact_2", kv_compact, ushort)
instantiate_kernel("kv_compact_1", kv_compact, uchar)
instantiate_kernel("kv_copy_16", kv_copy, uint4)
instantiate_kernel("kv_copy_8", kv_copy, uint2)
instantiate_kernel("kv_copy_4", kv_copy, uint)
instantiate_kernel("kv_copy_2", kv_copy, ushort)
instantiate_kernel("kv_copy_1", kv_copy, uchar)
