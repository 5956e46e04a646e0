"""Benchmark the native CPU ops (``redrafter_ext.ops``) against the pure-PyTorch reference.

Every configuration is first checked (native == reference: integer outputs exact, beam_topk scores
within 1e-4), then timed. One line per (op, shape): median and spread (interquartile range) of the
reference and of the native op, the number of timed runs of each, the speedup, and the bandwidth
where it means something (beam_topk: logits bytes read; kv_compact: K/V bytes read + written;
skinny_linear: weight bytes read, its "reference" being ``F.linear`` over the unpacked weight).

    python bench/bench_ops.py            # the full grid (several minutes on 2 busy cores)
    python bench/bench_ops.py --quick    # a smoke run: one small shape per op

The native op always gets >= --runs timed runs. The reference gets --runs too unless that would
exceed --ref-budget seconds for the line (the slowest reference shapes take seconds per call); it
then gets as many as fit, at least 3, and the run count column says so.
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
from timing import stats_ms, timed  # bench/timing.py, next to this script

from redrafter_ext import ops
from redrafter_ext import reference as ref

HEADER = (
    f"{'op':<14} {'shape':<44} {'ref ms':>9} {'(IQR)':>8} {'n':>3}  {'native ms':>9} {'(IQR)':>8} {'n':>3}"
    f"  {'speedup':>8} {'GB/s':>6}"
)


class Bench:
    def __init__(self, runs: int, ref_budget: float):
        self.runs, self.ref_budget = runs, ref_budget
        self.rows: list[tuple[str, float]] = []

    def line(self, op, shape, args, setup=None, nbytes=None, ref_fn=None, native_fn=None, calls=1):
        """Time ``reference.<op>(*args)`` and ``ops.<op>(*args)`` (or ``ref_fn()`` and ``native_fn()``,
        each making ``calls`` calls: the times printed are per call)."""
        ref_fn = ref_fn or (lambda: getattr(ref, op)(*args))
        native_fn = native_fn or (lambda: getattr(ops, op)(*args))
        r = timed(ref_fn, setup, self.runs, self.ref_budget)
        n = timed(native_fn, setup, self.runs, float("inf"))
        (rm, ri), (nm, ni) = (tuple(v / calls for v in stats_ms(t)) for t in (r, n))
        gbs = f"{nbytes / (nm * 1e-3) / 1e9:6.1f}" if nbytes else f"{'':>6}"
        print(
            f"{op:<14} {shape:<44} {rm:9.3f} {ri:8.3f} {len(r):3d}  {nm:9.3f} {ni:8.3f} {len(n):3d}"
            f"  {rm / nm:7.1f}x {gbs}",
            flush=True,
        )
        self.rows.append((op, rm / nm))


def fail(op: str, shape: str, what: str):
    raise SystemExit(f"{op} {shape}: native != reference ({what}); not timing a wrong kernel")


# ------------------------------------------------------------------------------------------------


def beams_with_sharing(B: int, W: int, L: int, g: torch.Generator) -> torch.Tensor:
    """Beams as beam search leaves them: later beams copy a prefix of an earlier one."""
    beams = torch.randint(0, 32000, (B, W, L), generator=g)
    beams[:, :, 0] = beams[:, :1, 0]
    for w in range(1, W):
        src = torch.randint(0, w, (B,), generator=g)
        k = torch.randint(1, L, (B,), generator=g)
        for b in range(B):
            beams[b, w, : k[b]] = beams[b, src[b], : k[b]]
    return beams.to(torch.int32)


def bench_tree_mask(bench, grid, g):
    for B, W, L in grid:
        beams = beams_with_sharing(B, W, L, g)
        _, parent, _, _, n = ref.build_trie(beams)
        shape = f"B={B} W={W} L={L} N={parent.shape[1]}"
        if not torch.equal(ops.tree_mask(parent, n), ref.tree_mask(parent, n)):
            fail("tree_mask", shape, "mask")
        bench.line("tree_mask", shape, (parent, n))


def bench_beam_topk(bench, grid, D, dtype, g):
    for B, W, V in grid:
        L, step = 8, 7
        logits = (torch.randn(B, W, V, generator=g) * 4).to(dtype)
        scores = -(torch.rand(B, W, generator=g) * 20).sort(dim=1).values
        tokens = torch.randint(0, V, (B, W, L), generator=g, dtype=torch.int32)
        state = torch.randn(B, W, D, generator=g).to(dtype)
        args = (logits, scores, tokens, state, step)
        shape = f"B={B} W={W} V={V} D={D} {str(dtype)[6:]}"
        got, exp = ops.beam_topk(*args), ref.beam_topk(*args)
        if not (torch.equal(got[3], exp[3]) and torch.equal(got[1], exp[1]) and torch.equal(got[2], exp[2])):
            fail("beam_topk", shape, "parent/tokens/state")
        if not torch.allclose(got[0], exp[0], atol=1e-4, rtol=1e-6):
            fail("beam_topk", shape, "scores")
        bench.line("beam_topk", shape, args, nbytes=logits.numel() * logits.element_size())


def bench_build_trie(bench, grid, g):
    for B, W, L in grid:
        beams = beams_with_sharing(B, W, L, g)
        shape = f"B={B} W={W} L={L}"
        if not all(torch.equal(a, b) for a, b in zip(ops.build_trie(beams), ref.build_trie(beams), strict=True)):
            fail("build_trie", shape, "trie")
        bench.line("build_trie", shape, (beams,))


def plant_argmax(logits, beams, beam_node, follow, g):
    """Make the argmax at each node the token of one of its children with probability ``follow``
    (so acceptance is realistic rather than ~0 on random logits). Returns the planted positions."""
    B, W, L = beams.shape
    planted = []
    for b in range(B):
        children: dict[int, list[int]] = {}
        for w, d in itertools.product(range(W), range(L - 1)):
            children.setdefault(int(beam_node[b, w, d]), []).append(int(beams[b, w, d + 1]))
        for node, kids in children.items():
            if float(torch.rand((), generator=g)) < follow:
                tok = kids[int(torch.randint(0, len(kids), (), generator=g))]
                planted.append((b, node, tok))
    idx = torch.tensor(planted, dtype=torch.int64).reshape(-1, 3)
    logits[idx[:, 0], idx[:, 1], idx[:, 2]] = 100.0
    return idx


def bench_verify_greedy(bench, grid, dtype, g):
    pools: dict[int, torch.Tensor] = {}
    for B, W, L, V in grid:
        N = 1 + W * (L - 1)
        if V not in pools:  # one random pool per V, sized for the largest shape; shapes take a prefix
            big = max(b * (1 + w * (l - 1)) for b, w, l, v in grid if v == V) * V
            pools[V] = torch.empty(big, dtype=dtype).uniform_(generator=g)
        logits = pools[V][: B * N * V].view(B, N, V)
        beams = beams_with_sharing(B, W, L, g)
        beam_node = ref.build_trie(beams)[3]
        planted = plant_argmax(logits, beams, beam_node, 0.8, g)
        got, exp = ops.verify_greedy(logits, beams, beam_node), ref.verify_greedy(logits, beams, beam_node)
        shape = f"B={B} W={W} L={L} V={V} {str(dtype)[6:]} acc={exp[0].float().mean():.1f}"
        if not all(torch.equal(a, b) for a, b in zip(got, exp, strict=True)):
            fail("verify_greedy", shape, "accept/path")
        bench.line("verify_greedy", shape, (logits, beams, beam_node))
        logits[planted[:, 0], planted[:, 1], planted[:, 2]] = 0.5  # un-plant for the next shape


def bench_kv_compact(bench, grid, n_layers, H, S, D, W, g):
    for B, L in grid:
        N = 1 + W * (L - 1)
        # the timed cache is filled with a constant (a random fill of GBs costs more than the whole
        # benchmark; a non-zero fill makes every page real, as in a used cache); the check below
        # runs on random values
        kv = torch.empty(n_layers, 2, B, H, S, D, dtype=torch.bfloat16).fill_(0.5)
        acc = torch.randint(1, L, (B,), generator=g)  # 1..L-1 accepted draft tokens
        path = torch.full((B, L), -1, dtype=torch.int64)
        for b in range(B):  # increasing trie nodes, path[i] >= i
            nodes = torch.randperm(N - 1, generator=g)[: L - 1].sort().values + 1
            path[b, 0] = 0
            path[b, 1:] = torch.maximum(nodes, torch.arange(1, L))
            path[b] = torch.cummax(path[b], 0).values
        cache0 = torch.full((B,), S - N - 1, dtype=torch.int32)
        cache_len = cache0.clone()
        shape = f"{n_layers}x2xB={B}x{H}x{S}x{D} bf16 L={L} acc={acc.float().mean():.1f}"
        # check on a 2-layer cache (same rows, heads and path): a copy of the full one would double memory
        k1 = torch.empty(2, 2, B, H, S, D, dtype=torch.bfloat16).uniform_(generator=g)
        k2 = k1.clone()
        c1, c2 = cache0.clone(), cache0.clone()
        ops.kv_compact(k1, c1, path, acc)
        ref.kv_compact(k2, c2, path, acc)
        if not (torch.equal(k1, k2) and torch.equal(c1, c2)):
            fail("kv_compact", shape, "cache")
        del k1, k2
        moved = sum(int((path[b, : acc[b] + 1] != torch.arange(acc[b] + 1)).sum()) for b in range(B))
        nbytes = 2 * n_layers * 2 * H * D * kv.element_size() * moved  # read + write
        setup = functools.partial(cache_len.copy_, cache0)  # each call advances cache_len
        bench.line("kv_compact", shape, (kv, cache_len, path, acc), setup=setup, nbytes=nbytes)
        del kv


def bench_skinny_linear(bench, grid, g):
    """skinny_linear against what a model would otherwise run, ``F.linear`` over the row-major
    weight (MKL: a GEMV for one row, a GEMM that repacks the weight for more). Each timed call
    multiplies by a stack of distinct weights of ~1 GiB, so the weights come from memory as in a
    forward of a real model, not from cache (last-level caches reach hundreds of MB: 480 MiB on
    this project's machine); times and GB/s are per weight."""
    for (N, K), M in grid:
        count = max(1, (1 << 30) // (N * K * 4))
        ws = [torch.randn(N, K, generator=g) for _ in range(count)]
        packed = [ops.skinny_pack(w) for w in ws]
        x = torch.randn(M, K, generator=g)
        shape = f"M={M} N={N} K={K} fp32 (x{count} weights)"
        want = torch.nn.functional.linear(x, ws[0])
        if not torch.allclose(ops.skinny_linear(x, packed[0], N), want, atol=1e-4, rtol=1e-4):
            fail("skinny_linear", shape, "values")
        # the model's call, torch.ops.redrafter.skinny_linear: no Python-side checks
        native = functools.partial(torch.ops.redrafter.skinny_linear, out_features=N)
        bench.line("skinny_linear", shape, None, nbytes=N * K * 4,
                   ref_fn=functools.partial(_each, torch.nn.functional.linear, x, ws),
                   native_fn=functools.partial(_each, native, x, packed), calls=count)


def _each(fn, x, weights):
    for w in weights:
        fn(x, w)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one small shape per op (smoke run)")
    p.add_argument("--runs", type=int, default=20, help="timed runs per line (native always gets them)")
    p.add_argument("--ref-budget", type=float, default=20.0, help="seconds of reference timing per line")
    p.add_argument("--ops", default="tree_mask,beam_topk,build_trie,verify_greedy,kv_compact,skinny_linear")
    p.add_argument("--kv-layers", type=int, default=32)
    p.add_argument("--kv-seq", type=int, default=2048)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    g = torch.Generator().manual_seed(args.seed)
    Bs, Ws, Ls, Vs = (1, 8), (8, 32, 64), (4, 8), (32000, 128256)
    kv_layers, kv_seq = args.kv_layers, args.kv_seq
    if args.quick:
        Bs, Ws, Ls, Vs = (1,), (8,), (4,), (32000,)
        kv_layers, kv_seq = min(kv_layers, 4), min(kv_seq, 512)
    print(
        f"redrafter_ext CPU ops, torch {torch.__version__}, {torch.get_num_threads()} threads; "
        f"reference = redrafter_ext.reference, native = torch.ops.redrafter; times in ms"
    )
    if kv_layers != 32 or kv_seq != 2048:
        print(f"note: kv_compact cache scaled to {kv_layers} layers x {kv_seq} slots (7B-like is 32 x 2048)")
    print(HEADER)
    bench = Bench(args.runs, args.ref_budget)
    want = set(args.ops.split(","))
    if "tree_mask" in want:
        bench_tree_mask(bench, list(itertools.product(Bs, Ws, Ls)), g)
    if "beam_topk" in want:
        bench_beam_topk(bench, list(itertools.product(Bs, Ws, Vs)), 4096, torch.float32, g)
    if "build_trie" in want:
        bench_build_trie(bench, list(itertools.product(Bs, Ws, Ls)), g)
    if "verify_greedy" in want:
        bench_verify_greedy(bench, list(itertools.product(Bs, Ws, Ls, Vs)), torch.bfloat16, g)
    if "kv_compact" in want:
        bench_kv_compact(bench, list(itertools.product(Bs, Ls)), kv_layers, 8, kv_seq, 128, 64, g)
    if "skinny_linear" in want:
        # SmolLM2-135M's layer shapes and LM head; rows of a decode step, trees, batches of trees
        shapes = ((1536, 576), (576, 1536), (49152, 576))
        rows = (1, 4, 8) if args.quick else (1, 2, 4, 8, 16, 32)
        bench_skinny_linear(bench, list(itertools.product(shapes[:1] if args.quick else shapes, rows)), g)
    worst: dict[str, float] = {}
    for op, s in bench.rows:
        worst[op] = min(s, worst.get(op, float("inf")))
    print("lowest speedup per op: " + ", ".join(f"{op} {s:.1f}x" for op, s in worst.items()))


if __name__ == "__main__":
    main()
