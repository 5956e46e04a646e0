"""Batch-size benchmark: greedy AR vs ReDrafter throughput and per-token latency vs batch size.

    python bench/batch.py [--model smollm2-135m-instruct|tiny|PATH] [--quick] [--threads 1]
                          [--batches 1 2 4 8 16 32] [-W 1 -L 3] [--runs 3]

A fixed pool of prompts with mixed lengths is decoded in batches of B rows, for every B (the same
work at every B). Rows stop at EOS at different steps: by default (``--eos auto``) a chat model's
own EOS, otherwise a token the model emits early in some rows and never in others, so rows finish
at different steps and the rest run to ``--max-new-tokens``. Before timing, every configuration's
outputs are checked equal to batch-1 AR, row by row. AR and ReDrafter runs alternate (AR first in
even pairs, second in odd) so that a change of load hits both alike; the speedup is the median of
the per-pair ratios (spread min..max); each row records the load average and the thread count,
and a speedup above tokens per step is flagged ``suspect``.

Columns: ``tok_s`` generated tokens per second summed over rows (median of ``--runs``, spread
min..max); ``ms_per_token`` the time between two tokens of a running row: each batch's wall time
divided by the tokens of its longest row, averaged over the batches; ``tokens_per_step`` mean
tokens committed per row per decode step; ``speedup`` ReDrafter over AR at the same B. Writes
``batch.csv`` (row by row, as measured) and ``batch.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import redrafter_ext as rx
from redrafter_ext.demo import CHECKPOINTS, DEFAULT_MODEL, DTYPES, load_named, load_prompt_ids
from redrafter_ext.profiling import choose_threads

HEADER = ["method", "B", "W", "L", "rows", "tokens", "tok_s", "tok_s_spread", "ms_per_token", "tokens_per_step",
          "speedup", "speedup_spread", "suspect", "drafter_dtype", "threads", "loadavg1"]


def pick_eos(free: list[list[int]], max_new: int) -> int:
    """A token some rows emit (first at distinct steps) and at least half never emit."""
    first: dict[int, dict[int, int]] = {}
    for r, row in enumerate(free):
        for i, t in enumerate(row[: max_new - 2]):
            first.setdefault(t, {}).setdefault(r, i)
    cands = [(len(set(pos.values())), -t, t) for t, pos in first.items() if 0 < len(pos) <= len(free) // 2]
    if not cands:
        raise SystemExit("bench/batch.py: no token to serve as an EOS that stops rows at different steps; use --eos")
    return max(cands)[2]


def mixed_prompts(text, n: int, vocab: int) -> list[list[int]]:
    """n held-out prompts of mixed lengths: chat prompts as they are (cycled when n exceeds them),
    plain-text ones cut to 8..63 tokens."""
    if text.kind == "chat":
        held = [ids for _, ids in text.heldout(None)]
        return [held[i % len(held)] for i in range(n)]
    raw = load_prompt_ids(text.tok, n, 400, vocab) if text.kind in ("tokenizers", "none") else [
        ids for _, ids in text.heldout(n, 400)]
    return [p[: 8 + (23 * i) % 56] for i, p in enumerate(raw)]


def run(fn, prompts: list[list[int]], B: int):
    """Decode ``prompts`` in batches of B; returns (rows' tokens, wall seconds, ms per token, steps, tokens)."""
    tokens, wall, lat, steps = [], 0.0, [], 0
    for s in range(0, len(prompts), B):
        t0 = time.perf_counter()
        out = fn(prompts[s : s + B])
        dt = time.perf_counter() - t0
        wall += dt
        tokens += out.tokens
        steps += sum(out.steps)
        lat.append(1e3 * dt / max(1, max(map(len, out.tokens))))
    return tokens, wall, statistics.mean(lat), steps


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="smollm2-135m-instruct, tiny, or a Hugging Face Llama folder")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for --model)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--beam-width", "-W", type=int, default=1)
    p.add_argument("--beam-length", "-L", type=int, default=3)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--pool", type=int, default=None, help="prompts decoded at every B (default: the largest B)")
    p.add_argument("--eos", default="auto",
                   help="'auto' (a chat model's EOS, else a token that stops rows at different steps), 'model', "
                   "'none' or an id")
    p.add_argument("--target", choices=("llama", "hf"), default="llama",
                   help="redrafter_ext.LlamaTarget or the transformers adapter (adapters.hf.HFTarget)")
    p.add_argument("--quick", action="store_true", help="batches 1 2 8, 8 prompts, 16 tokens, 1 run (smoke test)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the cores the load leaves free)")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES) + ["auto"], default="auto",
                   help="auto (default, as the demo): the checkpoint's bf16 at B=1, float32 above")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="batch", help="output file stem")
    a = p.parse_args(argv)
    if a.quick:
        a.batches, a.runs, a.max_new_tokens, a.pool = [1, 2, 8], 1, 16, 8
    threads, warning = choose_threads(a.threads)
    torch.set_num_threads(threads)
    if warning:
        print(f"# WARNING: {warning}", file=sys.stderr)
    pool = a.pool or max(a.batches)
    if any(pool % B for B in a.batches):
        raise SystemExit(f"bench/batch.py: --pool {pool} must be a multiple of every batch size {a.batches}")

    target, drafter, text, desc = load_named(a.model, a.drafter, DTYPES.get(a.drafter_dtype))
    if a.target == "hf":
        from redrafter_ext.adapters.hf import HFTarget
        from redrafter_ext.hub import model_folder

        folder = CHECKPOINTS / "target" if a.model == "tiny" else model_folder(a.model)
        target = HFTarget.from_pretrained(folder, dtype=torch.float32)
        desc += " via transformers (adapters.hf)"
    W, L, M = a.beam_width, a.beam_length, a.max_new_tokens
    prompts = mixed_prompts(text, pool, target.vocab_size)

    # reference: batch-1 AR, free-running first when the EOS is picked from it
    def ar(rows, eos=None):
        return rx.autoregressive_generate(target, rows, M, eos_id=eos)

    free = None
    if a.eos == "auto" and text.kind == "chat":
        eos = target.config.eos_token_id
    elif a.eos == "auto":
        free = [ar([q]).tokens[0] for q in prompts]
        eos = pick_eos(free, M)
    elif a.eos == "model":
        eos = target.config.eos_token_id
    elif a.eos == "none":
        eos = None
    else:
        eos = int(a.eos)
    if free is not None:  # greedy AR with an EOS is the free-running output cut after the first EOS
        ref = [r[: r.index(eos) + 1] if eos in r else r for r in free]
    else:
        ref = [ar([q], eos).tokens[0] for q in prompts]
    n_tok = sum(map(len, ref))
    lens = sorted(map(len, ref))
    ddt = "auto (bf16 at B=1, float32 above)" if a.drafter_dtype == "auto" else next(drafter.parameters()).dtype
    print(f"# {desc}; torch {torch.__version__}, {torch.get_num_threads()} threads; W={W} L={L}, drafter {ddt}; {pool} prompts of "
          f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens; eos={eos}: rows generate {lens[0]}..{lens[-1]} "
          f"tokens (max {M}), {n_tok} in all; median of {a.runs} interleaved runs; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    print(" | ".join(HEADER), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = a.out / f"{a.name}.csv", a.out / f"{a.name}.png"
    rows = []
    with open(csv_path, "w", newline="") as f:  # written row by row: an interrupted run keeps its rows
        writer = csv.DictWriter(f, fieldnames=HEADER)
        writer.writeheader()
        for B in a.batches:
            if a.drafter_dtype == "auto":  # bf16 <-> float32 round trips are exact, so one load serves all B
                drafter.to(torch.bfloat16 if B == 1 else torch.float32)
            ddt_b = str(next(drafter.parameters()).dtype).removeprefix("torch.")
            methods = {
                "ar": lambda rows_: ar(rows_, eos),
                "redrafter": lambda rows_: rx.generate(target, drafter, rows_, M, beam_width=W, beam_length=L, eos_id=eos),
            }
            results = {}
            for name, fn in methods.items():
                got, *_ = run(fn, prompts, B)  # correctness first (and warm-up)
                if got != ref:
                    bad = next(i for i, (x, y) in enumerate(zip(got, ref)) if x != y)
                    print(f"MISMATCH: {name} at B={B}, row {bad} differs from batch-1 AR", file=sys.stderr)
                    return 1
                results[name] = ([], [], 0)
            load0 = os.getloadavg()[0]
            for i in range(a.runs):  # alternate the methods, AR first in even pairs and second in odd
                for name in (("ar", "redrafter") if i % 2 == 0 else ("redrafter", "ar")):
                    _, wall, lat, steps = run(methods[name], prompts, B)
                    walls, lats, _ = results[name]
                    walls.append(wall)
                    lats.append(lat)
                    results[name] = (walls, lats, steps)
            load = round((load0 + os.getloadavg()[0]) / 2, 2)
            ar_walls = results["ar"][0]
            for name in ("ar", "redrafter"):
                walls, lats, steps = results[name]
                tps = [n_tok / w for w in walls]
                med = statistics.median(tps)
                ratios = [aw / w for aw, w in zip(ar_walls, walls)]  # per interleaved pair
                speedup = statistics.median(ratios)
                tps_step = n_tok / max(1, steps)
                r = {
                    "method": name, "B": B, "W": W if name == "redrafter" else 1, "L": L if name == "redrafter" else 1,
                    "rows": pool, "tokens": n_tok, "tok_s": med, "tok_s_spread": f"{min(tps):.1f}..{max(tps):.1f}",
                    "ms_per_token": statistics.median(lats), "tokens_per_step": tps_step,
                    "speedup": speedup, "speedup_spread": f"{min(ratios):.2f}..{max(ratios):.2f}",
                    "suspect": "speedup>tokens/step" if speedup > tps_step * 1.0001 else "",
                    "drafter_dtype": ddt_b if name == "redrafter" else "",
                    "threads": torch.get_num_threads(), "loadavg1": load,
                }
                if r["suspect"]:
                    print(f"# SUSPECT: {name} at B={B}: speedup {speedup:.2f}x exceeds {tps_step:.2f} tokens/step",
                          file=sys.stderr)
                rows.append(r)
                writer.writerow(r)
                f.flush()
                print(" | ".join(f"{r[h]:.2f}" if isinstance(r[h], float) else str(r[h]) for h in HEADER), flush=True)
    loads = [r["loadavg1"] for r in rows]
    plot(rows, png_path, f"{a.model}: W={W} L={L}, drafter {ddt}, {pool} prompts, max {M} new tokens, "
         f"{torch.get_num_threads()} threads, load {min(loads, default=0):.1f}..{max(loads, default=0):.1f}")
    print(f"# wrote {csv_path} and {png_path}")
    return 0


def plot(rows, path: Path, subtitle: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, style in (("ar", "s--"), ("redrafter", "o-")):
        rs = sorted((r for r in rows if r["method"] == name), key=lambda r: r["B"])
        bs = [r["B"] for r in rs]
        axes[0].plot(bs, [r["tok_s"] for r in rs], style, label=name)
        axes[1].plot(bs, [r["ms_per_token"] for r in rs], style, label=name)
        if name == "redrafter":
            sp = [r["speedup"] for r in rs]
            lo_hi = [tuple(map(float, r["speedup_spread"].split(".."))) for r in rs]
            # the spread is stored rounded to 2 decimals: clamp so it still brackets the median
            err = [[max(0.0, s - lh[0]) for s, lh in zip(sp, lo_hi)], [max(0.0, lh[1] - s) for s, lh in zip(sp, lo_hi)]]
            axes[2].errorbar(bs, sp, yerr=err, fmt=style, capsize=3, label="ReDrafter / AR (min..max)")
    axes[2].axhline(1.0, color="gray", lw=0.8)
    for ax, title, ylabel in zip(axes, ("throughput (sum over rows)", "latency per token of a running row",
                                        "speedup at equal batch"), ("tokens/s", "ms/token", "x")):
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="batch size", ylabel=ylabel)
        ax.legend()
    fig.suptitle(subtitle)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
