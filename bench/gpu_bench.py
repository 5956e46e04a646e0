"""GPU timing of every native CUDA op against its reference torch composition (same GPU).

One line per configuration: native and reference time (CUDA events, median of 50 after warm-up),
speedup, the bytes the op must move at least (the same minimum as bench/traffic.py, which models
the kernels' traffic without a GPU), and the time that takes at the measured copy bandwidth
(device-to-device copy of 1 GiB): ``bound``. Each configuration is checked against the
reference before it is timed. Run by bench/gpu_check.sh; needs a CUDA GPU.
"""

from __future__ import annotations

import statistics
from functools import partial

import torch

import redrafter_ext.ops as ops
from redrafter_ext import reference as ref


def timeit(fn, iters=50, warmup=5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)  # us
    return statistics.median(times)


def copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    us = timeit(lambda: y.copy_(x), iters=20)
    return 2 * x.numel() / (us * 1e-6)  # bytes/s, read + write


def row(name, cfg, native_us, ref_us, nbytes, bw):
    bound = nbytes / bw * 1e6
    print(f"{name:14s} {cfg:38s} native {native_us:9.1f} us  reference {ref_us:9.1f} us  "
          f"x{ref_us / native_us:6.1f}  bytes {nbytes / 1e6:9.2f} MB  bound {bound:8.1f} us  "
          f"({100 * bound / native_us:5.1f}% of bound)", flush=True)


def main() -> None:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth()
    print(f"# {torch.cuda.get_device_name()}  copy bandwidth {bw / 1e12:.2f} TB/s  torch {torch.__version__}")

    for B, W, V, dt, D in [(1, 8, 128256, torch.bfloat16, 512), (64, 8, 128256, torch.bfloat16, 512),
                           (256, 4, 32000, torch.float16, 512), (4, 64, 128256, torch.float32, 512),
                           (1, 64, 128256, torch.bfloat16, 4096), (64, 64, 128256, torch.bfloat16, 4096)]:
        L = 5
        logits = (torch.randn(B, W, V, device=dev, generator=g) * 3).to(dt)
        scores = -(torch.rand(B, W, device=dev, generator=g) * 10).sort(dim=1).values
        tokens = torch.randint(0, V, (B, W, L), device=dev, generator=g, dtype=torch.int32)
        state = torch.randn(B, W, D, device=dev, generator=g).to(dt)
        args = (logits, scores, tokens, state, 2)
        got, exp = ops.beam_topk(*args), ref.beam_topk(*args)
        assert torch.equal(got[3], exp[3]) and torch.equal(got[1], exp[1]), "beam_topk differs from the reference"
        # logits and state in, state out; scores, tokens and parents in and out
        nbytes = (logits.numel() * logits.element_size() + 2 * state.numel() * state.element_size()
                  + B * W * (2 * 4 + 2 * L * 4 + 4))
        row("beam_topk", f"B={B} W={W} V={V} {str(dt)[6:]} D={D}", timeit(partial(ops.beam_topk, *args)),
            timeit(partial(ref.beam_topk, *args)), nbytes, bw)

    for B, W, L in [(1, 8, 5), (256, 64, 16)]:
        beams = torch.randint(0, 3, (B, W, L), device=dev, generator=g, dtype=torch.int32)
        got, exp = ops.build_trie(beams), ref.build_trie(beams)
        assert all(torch.equal(a, b) for a, b in zip(got, exp)), "build_trie differs from the reference"
        N = 1 + W * (L - 1)
        row("build_trie", f"B={B} W={W} L={L}", timeit(partial(ops.build_trie, beams)),
            timeit(partial(ref.build_trie, beams)), B * W * L * 8 + 3 * B * N * 4, bw)
        parent, n = exp[1], exp[4]
        for packed in (False, True):
            assert torch.equal(ops.tree_mask(parent, n, packed), ref.tree_mask(parent, n, packed))
            out_bytes = B * N * ((N + 31) // 32) * 4 if packed else B * N * N
            row("tree_mask", f"B={B} N={N} packed={packed}", timeit(partial(ops.tree_mask, parent, n, packed)),
                timeit(partial(ref.tree_mask, parent, n, packed)), out_bytes + B * N * 4, bw)

    for B, S, max_n, m in [(1, 4096, 3, 4), (64, 4096, 3, 4), (256, 2048, 4, 15)]:
        # a small alphabet, so that keys recur and the drafts come from real matches
        tokens = torch.randint(0, 50, (B, S), device=dev, generator=g, dtype=torch.int32)
        length = torch.randint(S // 2, S + 1, (B,), device=dev, generator=g, dtype=torch.int32)
        got, exp = ops.ngram_lookup(tokens, length, max_n, m), ref.ngram_lookup(tokens, length, max_n, m)
        assert torch.equal(got, exp), "ngram_lookup differs from the reference"
        # each row's history read once (at most max_n tokens per end, from cache), lengths in, drafts out
        nbytes = int(length.sum()) * 4 + B * 4 + B * m * 4
        row("ngram_lookup", f"B={B} S={S} max_n={max_n} m={m}", timeit(partial(ops.ngram_lookup, tokens, length, max_n, m)),
            timeit(partial(ref.ngram_lookup, tokens, length, max_n, m)), nbytes, bw)

    for B, W, L, V, dt in [(1, 8, 5, 128256, torch.bfloat16), (64, 8, 5, 128256, torch.bfloat16),
                           (16, 64, 5, 32000, torch.float16), (1, 64, 5, 128256, torch.bfloat16),
                           (64, 64, 5, 128256, torch.bfloat16)]:
        beams = torch.randint(0, 4, (B, W, L), device=dev, generator=g, dtype=torch.int32)
        beam_node = ref.build_trie(beams)[3]
        N = 1 + W * (L - 1)
        logits = torch.randn(B, N, V, device=dev, generator=g)
        logits[:, :, :4] += 4 * torch.rand(B, N, 4, device=dev, generator=g)
        logits = logits.to(dt)
        got, exp = ops.verify_greedy(logits, beams, beam_node), ref.verify_greedy(logits, beams, beam_node)
        assert all(torch.equal(a, b) for a, b in zip(got, exp)), "verify_greedy differs from the reference"
        # the accepted path's and the stop node's logits: what the lazy strategy reads (the kernel
        # reads every referenced node instead when that is small: ~16 MB per depth)
        acc = exp[0].to(torch.int64)
        nbytes = int((acc + 1).sum()) * V * logits.element_size() + 2 * beams.numel() * 4
        row("verify_greedy", f"B={B} W={W} L={L} V={V} {str(dt)[6:]}",
            timeit(partial(ops.verify_greedy, logits, beams, beam_node)),
            timeit(partial(ref.verify_greedy, logits, beams, beam_node)), nbytes, bw)

    for B, W, L, V, dt, (t, k, tp) in [(1, 8, 5, 128256, torch.bfloat16, (1.0, 0, 1.0)),
                                       (1, 8, 5, 128256, torch.bfloat16, (0.8, 50, 0.9)),
                                       (64, 8, 5, 128256, torch.bfloat16, (1.0, 0, 1.0)),
                                       (16, 64, 5, 32000, torch.float16, (1.0, 0, 0.95)),
                                       (1, 64, 5, 128256, torch.bfloat16, (1.0, 0, 1.0)),
                                       (64, 64, 5, 128256, torch.bfloat16, (0.8, 50, 0.9))]:
        beams = torch.randint(0, 4, (B, W, L), device=dev, generator=g, dtype=torch.int32)
        beam_node = ref.build_trie(beams)[3]
        N = 1 + W * (L - 1)
        logits = torch.randn(B, N, V, device=dev, generator=g)
        logits[:, :, :4] += 9 * torch.rand(B, N, 4, device=dev, generator=g)
        logits = logits.to(dt)
        au = torch.rand(B, L - 1, W, device=dev, generator=g)
        su = torch.rand(B, device=dev, generator=g)
        args = (logits, beams, beam_node, au, su, t, k, tp)
        got, exp = ops.verify_sample(*args), ref.verify_sample(*args)
        # block sums vs the reference's sequential sums: a row could differ only when a uniform lies
        # within ~1e-15 of its threshold (docs/verify_sample_cuda_notes.md)
        rows_equal = (got[0] == exp[0]) & (got[1] == exp[1]) & (got[2] == exp[2]).all(dim=1) & (got[3] == exp[3])
        assert bool(rows_equal.all()), f"verify_sample differs from the reference on {int((~rows_equal).sum())} rows"
        acc = exp[0].to(torch.int64)
        nbytes = int((acc + 1).sum()) * V * logits.element_size()  # the visited nodes' logits
        row("verify_sample", f"B={B} W={W} L={L} V={V} {str(dt)[6:]} T={t} k={k} p={tp}",
            timeit(partial(ops.verify_sample, *args)), timeit(partial(ref.verify_sample, *args)), nbytes, bw)

    for n_layers, B, H, S, Dh, L in [(32, 1, 8, 4096, 128, 5), (32, 64, 8, 2048, 128, 5)]:
        kv = torch.randn(n_layers, 2, B, H, S, Dh, device=dev, generator=g, dtype=torch.bfloat16)
        acc = torch.full((B,), L - 1, device=dev)
        path = (torch.arange(L, device=dev) * 3)[None].expand(B, L).contiguous()
        cache_len = torch.full((B,), 100, dtype=torch.int32, device=dev)
        k1, c1, k2, c2 = kv.clone(), cache_len.clone(), kv.clone(), cache_len.clone()
        ops.kv_compact(k1, c1, path, acc)
        ref.kv_compact(k2, c2, path, acc)
        assert torch.equal(k1, k2) and torch.equal(c1, c2), "kv_compact differs from the reference"
        del k2
        c = cache_len.clone()

        def compact(fn, k1=k1, c=c, cache_len=cache_len, path=path, acc=acc):
            c.copy_(cache_len)  # the same positions every iteration (the op is in place)
            fn(k1, c, path, acc)

        native, reference = partial(compact, ops.kv_compact), partial(compact, ref.kv_compact)
        nbytes = 2 * n_layers * 2 * B * H * (L - 1) * Dh * 2  # read + write of the moved slots
        row("kv_compact", f"layers={n_layers} B={B} H={H} S={S} D={Dh} L={L}", timeit(native), timeit(reference),
            nbytes, bw)


if __name__ == "__main__":
    main()
