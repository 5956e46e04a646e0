"""Benchmark the MLX backend on the present MLX device (``mx.default_device()``).

1. Per op: the native MLX ops (``redrafter_ext.mlx.ops``, when its extension is built) against the
   pure-MLX reference (``redrafter_ext.mlx.reference``). Every configuration is checked first
   (native == reference: integer outputs exact, beam_topk scores within 1e-4), then timed: one
   line per (op, shape, implementation) with the median and interquartile range of
   ``op + mx.eval`` wall time. Without the native extension only the reference is timed (said so).
2. End to end on ``--model`` (``tiny`` by default; ``smollm2-135m-instruct``, or a Hugging Face Llama
   folder): plain greedy decoding (AR) against ReDrafter at a few (W, L), tokens/s and tokens/step;
   ReDrafter's tokens are checked equal to AR's before reporting, and MLX's greedy output is compared
   with the torch backend's on the same prompts (rows identical, and the common prefix length).

3. With ``--mlx-lm``, end to end through an unchanged mlx-lm model instead (``MLXLMTarget``, loaded
   with ``mlx_lm.load``): mlx-lm's own greedy generation (``generate_step``, argmax sampler) against
   plain decoding and ReDrafter over the same model object, tokens/s and tokens/step; every output
   is checked equal to mlx-lm's first.

    python bench/bench_mlx.py                 # quick (< 1 min on 2 busy cores)
    python bench/bench_mlx.py --full          # more shapes, longer generations
    python bench/bench_mlx.py --threads 2     # BLAS/OpenMP threads (set before MLX loads)
    python bench/bench_mlx.py --skip-ops --mlx-lm --model smollm2-135m-instruct --prompts 3

On Linux, ``mlx[cpu]`` links the reference (netlib) BLAS, so matmuls run at a fraction of a
GFLOP/s: absolute numbers here say little about Apple silicon, and nothing about how ReDrafter
compares with mlx-lm there (with this BLAS a forward of 7 tokens costs ~5 of one token; about one on a GPU).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from timing import stats_ms, timed  # bench/timing.py, next to this script


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="more shapes and longer generations")
    p.add_argument("--threads", type=int, default=1, help="OMP/BLAS threads (default 1: the machine is shared)")
    p.add_argument("--runs", type=int, default=0, help="timed runs per op line (default 10 quick, 40 full)")
    p.add_argument("--repeats", type=int, default=0, help="end-to-end repeats (default 3 quick, 5 full)")
    p.add_argument("--new-tokens", type=int, default=0, help="tokens generated per run (default 24 / 96)")
    p.add_argument("--drafter-dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="drafter compute dtype (default float32: faster than bf16 at small M on MLX's CPU)")
    p.add_argument("--prompts", type=int, default=0, help="held-out prompts, each run at batch 1 (default 1 / 3)")
    p.add_argument("--model", default="tiny", help="tiny, smollm2-135m-instruct, or a Hugging Face Llama folder")
    p.add_argument("--skip-ops", action="store_true")
    p.add_argument("--skip-e2e", action="store_true")
    p.add_argument("--configs", default="", help="ReDrafter (W, L) shapes end to end, e.g. 1x3,2x4 "
                   "(default 1x4,1x8; --full adds 2x4,4x4,2x6)")
    p.add_argument("--batch", action="store_true",
                   help="with --mlx-lm: also all prompts as one batch through ReDrafter, each row checked equal to "
                        "mlx-lm's output for that prompt alone")
    p.add_argument("--mlx-lm", action="store_true",
                   help="end to end through an unchanged mlx-lm model (MLXLMTarget): mlx-lm's own greedy "
                        "generation vs ReDrafter on the same model")
    return p.parse_args(argv)


def op_inputs(mx, ref, B: int, W: int, L: int, V: int, S: int):
    """Inputs for every op at one shape, built with the reference (so the trie is realistic)."""
    key = mx.random.key(0)
    k1, k2, k3, k4, k5 = mx.random.split(key, 5)
    N = ref.num_nodes_max(W, L)
    beams = mx.random.randint(0, 3, (B, W, L), key=k1).astype(mx.int32)
    beams = mx.where(mx.arange(L)[None, None, :] == 0, beams[:, :1, :1], beams)
    trie = ref.build_trie(beams)
    logits_n = mx.random.normal((B, N, V), key=k2)
    logits_w = mx.random.normal((B, W, V), key=k3)
    scores = mx.broadcast_to(mx.where(mx.arange(W) == 0, 0.0, -mx.inf), (B, W)).astype(mx.float32)
    state = mx.random.normal((B, W, 384), key=k4)
    g = ref.verify_greedy(logits_n, beams, trie[3])
    kv = mx.random.normal((6, 2, B, 2, S, 64), key=k5)
    cache_len = mx.full((B,), S - N - 1, dtype=mx.int32)
    au = mx.random.uniform(shape=(B, L - 1, W), key=k1)
    su = mx.random.uniform(shape=(B,), key=k2)
    history = mx.random.randint(0, 16, (B, S), key=k3).astype(mx.int32)  # prompt-lookup history
    history_len = mx.full((B,), S, dtype=mx.int32)
    arrays = [beams, *trie, logits_n, logits_w, scores, state, *g, kv, cache_len, au, su, history, history_len]
    mx.eval(arrays)
    return {
        "beam_topk": lambda o: o.beam_topk(logits_w, scores, beams, state, 1),
        "build_trie": lambda o: o.build_trie(beams),
        "tree_mask": lambda o: o.tree_mask(trie[1], trie[4]),
        "tree_mask_packed": lambda o: o.tree_mask(trie[1], trie[4], packed=True),
        "verify_greedy": lambda o: o.verify_greedy(logits_n, beams, trie[3]),
        "verify_sample": lambda o: o.verify_sample(logits_n, beams, trie[3], au, su, 1.0, 0, 0.9),
        "kv_compact": lambda o: o.kv_compact(kv, cache_len, g[2], g[0]),
        "ngram_lookup": lambda o: o.ngram_lookup(history, history_len, 3, L - 1),
    }


def check_same(mx, name: str, want, got) -> None:
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for i, (w, g) in enumerate(zip(want, got)):
        if w.shape != g.shape or w.dtype != g.dtype:
            raise SystemExit(f"{name}: output {i} is {g.dtype} {g.shape}, reference {w.dtype} {w.shape}")
        ok = mx.allclose(w, g, atol=1e-4, rtol=1e-4) if mx.issubdtype(w.dtype, mx.floating) else mx.array_equal(w, g)
        if not ok.item():
            raise SystemExit(f"{name}: native output {i} differs from the reference")


def bench_ops(mx, ref, native, a) -> None:
    runs = a.runs or (40 if a.full else 10)
    shapes = [(1, 4, 4, 4096), (3, 2, 4, 4096)]
    if a.full:
        shapes += [(1, 1, 8, 4096), (7, 4, 6, 4096), (1, 8, 8, 32000), (3, 4, 4, 32000)]
    S = 256
    print(f"\n== per-op: {runs} timed runs each, op + mx.eval wall time, S={S} for kv_compact and ngram_lookup ==")
    if native is None:
        print("native MLX ops: NOT AVAILABLE (redrafter_ext.mlx.ops or its extension missing): timing the reference only")
    print(f"{'op':<17} {'B,W,L,V':<18} {'impl':<9} {'median ms':>10} {'IQR ms':>8} {'speedup':>8}")
    for B, W, L, V in shapes:
        for name, call in op_inputs(mx, ref, B, W, L, V, S).items():
            impls = [("reference", ref)] + ([("native", native)] if native is not None else [])
            if native is not None:
                check_same(mx, name, call(ref), call(native))
            med = {}
            for label, mod in impls:
                m, iqr = stats_ms(timed(lambda mod=mod, call=call: mx.eval(call(mod)), None, runs))
                med[label] = m
                sp = f"{med['reference'] / m:7.2f}x" if label == "native" else ""
                print(f"{name:<17} {f'{B},{W},{L},{V}':<18} {label:<9} {m:10.3f} {iqr:8.3f} {sp:>8}", flush=True)


def e2e_configs(a) -> list[tuple[int, int]]:
    """The (W, L) shapes run end to end: ``--configs``, else the defaults."""
    if not a.configs:
        return [(1, 4), (1, 8)] + ([(2, 4), (4, 4), (2, 6)] if a.full else [])
    try:
        return [(int(w), int(l_)) for w, l_ in (c.lower().split("x") for c in a.configs.split(","))]
    except ValueError:
        raise SystemExit(f"--configs: expected WxL,WxL,... (e.g. 1x4,2x4), got {a.configs!r}") from None


def bench_e2e(mx, rxm, a) -> None:
    import redrafter_ext as rx
    from redrafter_ext.demo import load_named
    from redrafter_ext.hub import drafter_folder, model_folder

    repeats = a.repeats or (5 if a.full else 3)
    n = a.new_tokens or (96 if a.full else 24)
    configs = e2e_configs(a)

    t_target, t_drafter, text, _ = load_named(a.model)  # the torch backend, for the comparison
    target = rxm.LlamaTarget.from_pretrained(model_folder(a.model))
    drafter = rxm.Drafter.from_pretrained(drafter_folder(a.model), dtype=getattr(mx, a.drafter_dtype))
    prompts = [ids for _, ids in text.heldout(a.prompts or (3 if a.full else 1), 160)]
    eos = target.config.eos_token_id
    t_ar = [rx.autoregressive_generate(t_target, [p], n, eos_id=eos).tokens[0] for p in prompts]
    ops = rxm.default_ops()
    print(f"\n== end to end: {a.model} (target float32, drafter {drafter.dtype}), batch 1, {len(prompts)} "
          f"held-out prompt(s) one after another, {n} new tokens each, median of {repeats} runs (prefill included), "
          f"ops: {ops.__name__} ==")
    print(f"{'method':<14} {'tok/s':>8} {'spread':>8} {'tok/step':>9} {'speedup':>8}")

    def run(fn):
        """(outputs per prompt, median tok/s, max - min tok/s) of ``fn(prompt, k)`` over all prompts."""
        times, outs = [], []
        fn(prompts[0], 8)  # warm-up (short)
        for _ in range(repeats):
            t0 = time.perf_counter()
            outs = [fn(p, n) for p in prompts]
            times.append(time.perf_counter() - t0)
        tokens = sum(len(o.tokens[0]) for o in outs)
        rates = sorted(tokens / t for t in times)
        per_step = tokens / sum(sum(o.steps) for o in outs)
        return [o.tokens for o in outs], statistics.median(rates), rates[-1] - rates[0], per_step

    ar, ar_rate, ar_spread, _ = run(lambda p, k: rxm.autoregressive_generate(target, [p], k, eos_id=eos))
    print(f"{'AR':<14} {ar_rate:8.1f} {ar_spread:8.1f} {1.0:9.2f} {1.0:7.2f}x", flush=True)
    # MLX vs torch greedy: float32 on both, but different kernels, so near-ties may break differently
    same = sum(m[0] == t for m, t in zip(ar, t_ar))
    prefix = [next((i for i, (x, y) in enumerate(zip(m[0], t)) if x != y), min(len(m[0]), len(t)))
              for m, t in zip(ar, t_ar)]
    print(f"MLX vs torch greedy AR: {same}/{len(prompts)} rows identical; common prefix {prefix} of "
          f"{[len(t) for t in t_ar]} tokens", flush=True)
    for W, L in configs:
        out, rate, spread, per_step = run(lambda p, k, W=W, L=L: rxm.generate(
            target, drafter, [p], k, beam_width=W, beam_length=L, ops=ops, eos_id=eos))
        if out != ar:
            raise SystemExit(f"ReDrafter W={W} L={L}: greedy output differs from AR")
        print(f"{f'W={W} L={L}':<14} {rate:8.1f} {spread:8.1f} {per_step:9.2f} {rate / ar_rate:7.2f}x", flush=True)


def forward_costs(mx, rxm, target, prompts, max_nodes: int, n: int, runs: int = 15) -> None:
    """One forward of T tokens after a committed context: the adapter (tree mask over all S slots,
    K/V written into the caller's cache) against mlx-lm's own KVCache step over the same model,
    interleaved so that load from other processes hits both alike; median ms of ``runs``."""
    from mlx_lm.models.cache import make_prompt_cache

    ctx = len(prompts[0]) + n // 2  # a mid-generation context
    S = len(prompts[0]) + n + max_nodes  # what generate allocates
    seq = mx.array([(prompts[0] * (1 + ctx // len(prompts[0])))[:ctx]], dtype=mx.int32)
    kv = target.new_kv_cache(1, S)
    _, _, kv = target.prefill(seq, mx.array([ctx], dtype=mx.int32), kv)
    cache = make_prompt_cache(target.model)
    mx.eval(kv, target.model(seq, cache=cache))
    print(f"per forward at context {ctx} (S = {S} slots), median ms of {runs} interleaved runs:")
    print(f"{'T':>3} {'MLXLMTarget':>12} {'mlx-lm KVCache':>15} {'ratio':>7}")
    for T in sorted({1, 4, max_nodes}):
        tok = mx.full((1, T), 5, dtype=mx.int32)
        pos = mx.array([[ctx + t for t in range(T)]], dtype=mx.int32)
        mask, cl = rxm.causal_tree_mask(1, T), mx.array([ctx], dtype=mx.int32)

        def ours(tok=tok, pos=pos, mask=mask, cl=cl):
            mx.eval(target(tok, pos, mask, cl, kv))

        def theirs(tok=tok, T=T):
            mx.eval(target.model(tok, cache=cache))
            for c in cache:
                c.trim(T)  # back to the same context for the next run

        ours(), theirs()
        a, b = [], []
        for _ in range(runs):
            for fn, acc in ((ours, a), (theirs, b)):
                t0 = time.perf_counter()
                fn()
                acc.append(time.perf_counter() - t0)
        ma, mb = statistics.median(a) * 1e3, statistics.median(b) * 1e3
        print(f"{T:>3} {ma:12.2f} {mb:15.2f} {ma / mb:6.2f}x", flush=True)


def bench_mlx_lm(mx, rxm, a) -> None:
    from types import SimpleNamespace

    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    from redrafter_ext.demo import Text
    from redrafter_ext.hub import drafter_folder, load_tokenizer, model_folder
    from redrafter_ext.mlx.adapters.mlx_lm import MLXLMTarget

    repeats = a.repeats or (5 if a.full else 3)
    n = a.new_tokens or (96 if a.full else 24)
    configs = e2e_configs(a)
    folder = model_folder(a.model)
    target = MLXLMTarget.from_pretrained(folder)  # mlx_lm.load, float32
    drafter = rxm.Drafter.from_pretrained(drafter_folder(a.model), dtype=getattr(mx, a.drafter_dtype))
    tok = load_tokenizer(folder)
    kind = "none" if tok is None else ("chat" if getattr(tok, "chat_template", None) else "hf")
    prompts = [ids for _, ids in Text(tok, kind, target.vocab_size).heldout(a.prompts or (3 if a.full else 1), 160)]
    eos = target.eos_token_id
    sampler = make_sampler(0.0)
    ops = rxm.default_ops()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n== end to end through mlx-lm: {a.model} ({folder}) loaded by mlx_lm.load as MLXLMTarget (float32), "
          f"drafter {drafter.dtype}, batch 1, {len(prompts)} held-out prompt(s) of {[len(p) for p in prompts]} tokens "
          f"one after another, up to {n} new tokens each (EOS {eos}), median of {repeats} runs interleaved across "
          f"methods (prefill included), "
          f"ops: {ops.__name__}, threads {a.threads}, load average {load} ==")
    print("Linux CPU MLX (netlib BLAS, shared cores): these speeds say nothing about Apple silicon.")

    def mlx_lm_greedy(p, k):
        """mlx-lm's own generation loop (its argmax sampler), stopped after the EOS (kept)."""
        out = []
        for t, _ in generate_step(mx.array(p), target.model, max_tokens=k, sampler=sampler):
            out.append(int(t))
            if out[-1] == eos:
                break
        return SimpleNamespace(tokens=[out], steps=[len(out)])

    methods = [("mlx-lm generate_step", mlx_lm_greedy),
               ("AR (MLXLMTarget)", lambda p, k: rxm.autoregressive_generate(target, [p], k, eos_id=eos))]
    methods += [(f"ReDrafter W={W} L={L}", lambda p, k, W=W, L=L: rxm.generate(
        target, drafter, [p], k, beam_width=W, beam_length=L, ops=ops, eos_id=eos)) for W, L in configs]
    forward_costs(mx, rxm, target, prompts, max(rxm.decode.num_nodes_max(W, L) for W, L in configs), n)
    print(f"{'method':<22} {'tok/s':>8} {'spread':>8} {'tok/step':>9} {'vs mlx-lm':>10}")
    # methods interleaved, their order rotated every repeat: load from other processes hits all alike
    times: dict[str, list[float]] = {name: [] for name, _ in methods}
    outs: dict[str, list] = {}
    for _, fn in methods:
        fn(prompts[0], 8)  # warm-up (short)
    for r in range(repeats):
        for name, fn in methods[r % len(methods):] + methods[: r % len(methods)]:
            t0 = time.perf_counter()
            outs[name] = [fn(p, n) for p in prompts]
            times[name].append(time.perf_counter() - t0)
    want = [o.tokens[0] for o in outs[methods[0][0]]]
    base = None
    for name, _ in methods:
        out = [o.tokens[0] for o in outs[name]]
        if out != want:
            raise SystemExit(f"{name}: greedy output differs from mlx-lm's own generation")
        tokens = sum(map(len, out))
        rates = sorted(tokens / t for t in times[name])
        rate, per_step = statistics.median(rates), tokens / sum(sum(o.steps) for o in outs[name])
        base = base or rate
        print(f"{name:<22} {rate:8.2f} {rates[-1] - rates[0]:8.2f} {per_step:9.2f} {rate / base:9.2f}x", flush=True)
    print(f"every output equals mlx-lm's ({sum(map(len, want))} tokens over {len(prompts)} prompts); "
          f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if a.batch:
        for W, L in configs:
            t0 = time.perf_counter()
            out = rxm.generate(target, drafter, prompts, n, beam_width=W, beam_length=L, ops=ops, eos_id=eos)
            dt = time.perf_counter() - t0
            if out.tokens != want:
                bad = [b for b in range(len(prompts)) if out.tokens[b] != want[b]]
                raise SystemExit(f"batch of {len(prompts)}, W={W} L={L}: rows {bad} differ from mlx-lm's own output")
            print(f"batch of {len(prompts)} (prompts of {min(map(len, prompts))}..{max(map(len, prompts))} tokens), "
                  f"W={W} L={L}: every row equals mlx-lm's output for its prompt alone; {out.tokens_per_step:.2f} "
                  f"tokens/step, {sum(map(len, out.tokens)) / dt:.2f} tok/s (one run)", flush=True)


def main(argv=None) -> int:
    a = parse_args(argv)
    # thread counts must be set before the BLAS/OpenMP runtimes load
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import mlx.core as mx
    import torch

    torch.set_num_threads(a.threads)  # the torch half of redrafter_ext is imported, not timed
    import redrafter_ext.mlx as rxm
    from redrafter_ext.mlx import reference as ref

    native = rxm.native_ops()
    print(f"mlx {mx.__version__}, device {mx.default_device()}, threads {a.threads}, "
          f"native ops: {'yes (' + native.__name__ + ')' if native else 'no'}, python {sys.version.split()[0]}")
    if not a.skip_ops:
        bench_ops(mx, ref, native, a)
    if not a.skip_e2e:
        (bench_mlx_lm if a.mlx_lm else bench_e2e)(mx, rxm, a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
