"""Batch-size benchmark: AR vs static ReDrafter shapes vs the adaptive policy, by batch size.

    python bench/batch.py [--model smollm2-135m-instruct|tiny|PATH] [--quick] [--threads 1]
                          [--batches 1 2 4 8 16 32] [--configs 1x4 1x8 2x4] [-T 0.7] [--runs 3]

At every batch size B, the same prompts (``--rows``: max(B, rows) held-out prompts of mixed
lengths; by default the largest B, so every B does the same work) are decoded in batches of B rows
by each method: ``ar`` (plain decoding), ``WxL`` (ReDrafter with a fixed shape, one per
``--configs``) and ``policy`` (``beam_width=beam_length="auto"``: a ``SpeculationPolicy`` whose
menu is (1, 1) plus the static shapes; one policy object for the whole run, as an engine keeps one,
so it calibrates once per row bucket and temperature). Rows stop at EOS at different steps: by
default (``--eos auto``) a chat model's own EOS, otherwise a token the model emits early in some
rows and never in others. Greedy: before timing, every method's outputs are checked equal to
batch-1 AR, row by row. Runs are interleaved: round i decodes each batch of B prompts with every
method in turn, in an order rotated by the round and the batch, so that a change of load hits all
alike; a method's speedup is the median over rounds of its
tokens/s over AR's in the same round (spread min..max); each row records the load average and the
thread count, and a speedup above tokens per step is flagged ``suspect``.

Columns: ``tok_s`` generated tokens per second summed over rows (median, spread min..max);
``ms_per_token`` the time between two tokens of a running row (each batch's wall time over the
tokens of its longest row); ``tokens_per_step`` tokens committed per row per decode step;
``idle_steps`` decode steps run after every row of a batch was done (summed over batches);
``best_static`` on the policy row: the fixed shape with the highest speedup at this B, and
``vs_best`` the policy's speedup over it. Writes ``NAME.csv`` (row by row, as measured) and
``NAME.png`` (speedup vs B: AR, the best static shape, the policy) under ``--out``.
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
from redrafter_ext._shape_checks import LOOKUP_DEFAULT
from redrafter_ext.demo import CHECKPOINTS, DEFAULT_MODEL, DTYPES, load_named, load_prompt_ids
from redrafter_ext.policy import SpeculationPolicy
from redrafter_ext.profiling import choose_threads, cpu_name

HEADER = ["method", "B", "W", "L", "rows", "tokens", "tok_s", "tok_s_spread", "ms_per_token", "tokens_per_step",
          "idle_steps", "speedup", "speedup_spread", "suspect", "best_static", "vs_best", "temperature",
          "drafter_dtype", "threads", "loadavg1"]


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


def run(fn, prompts: list[list[int]], B: int) -> dict:
    """Decode ``prompts`` in batches of B: the rows' tokens, wall seconds, ms per token of a running
    row, per-row decode steps summed, and steps run after every row of a batch was done."""
    return run_round({"m": fn}, ["m"], prompts, B, 0)["m"]


def run_round(methods: dict, names: list[str], prompts: list[list[int]], B: int, rnd: int) -> dict:
    """One round: each batch of B prompts decoded by every method in turn (the order rotated by
    round and batch), so that a change of load within the round hits every method alike (a round
    of whole runs one after another put seconds between them: on a shared machine per-round ratios
    then spread 0.7..1.05 for the same work). Per method, as ``run``."""
    acc = {name: {"tokens": [], "wall": 0.0, "lat": [], "steps": 0, "idle": 0} for name in names}
    for j, s in enumerate(range(0, len(prompts), B)):
        k = (rnd + j) % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            out = methods[name](prompts[s : s + B])
            dt = time.perf_counter() - t0
            r = acc[name]
            r["wall"] += dt
            r["tokens"] += out.tokens
            r["steps"] += sum(out.steps)
            r["idle"] += out.calls - max(out.steps)
            r["lat"].append(1e3 * dt / max(1, max(map(len, out.tokens))))
    return {name: {**r, "n": sum(map(len, r["tokens"])), "lat": statistics.mean(r["lat"])} for name, r in acc.items()}


def parse_configs(items: list[str]) -> list[tuple[int, int]]:
    out = []
    for c in items:
        try:
            w, length = (int(x) for x in c.lower().split("x"))
        except ValueError:
            raise SystemExit(f"bench/batch.py: --configs takes WxL pairs such as 1x4, got {c!r}") from None
        if w < 1 or length < 2:
            raise SystemExit(f"bench/batch.py: --configs {c}: W >= 1 and L >= 2 (L = 1 is the ar method)")
        out.append((w, length))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="smollm2-135m-instruct, tiny, or a Hugging Face Llama folder")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for --model)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--configs", nargs="+", default=["1x4", "1x8", "2x4"],
                   help="static shapes WxL timed against AR; the policy's menu is (1, 1) plus these")
    p.add_argument("--no-policy", action="store_true", help="time AR and the static shapes only")
    p.add_argument("--lookup", type=int, default=LOOKUP_DEFAULT,
                   help="the prompt-lookup beam's longest key in every ReDrafter method (docs/lookup.md; default: "
                   "generate's); 0: none")
    p.add_argument("--runs", type=int, default=3, help="interleaved rounds (each runs every method once)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--rows", type=int, default=None,
                   help="prompts decoded at each B: max(B, rows) (default: the largest B, the same work at every B)")
    p.add_argument("--eos", default="auto",
                   help="'auto' (a chat model's EOS, else a token that stops rows at different steps), 'model', "
                   "'none' or an id")
    p.add_argument("--temperature", "-T", type=float, default=0.0, help="0: greedy (default); > 0: sampling")
    p.add_argument("--seed", type=int, default=0, help="sampling: seed of the uniforms")
    p.add_argument("--target", choices=("llama", "hf"), default="llama",
                   help="redrafter_ext.LlamaTarget or the transformers adapter (adapters.hf.HFTarget)")
    p.add_argument("--quick", action="store_true", help="batches 1 2 8, 8 prompts, 16 tokens, 1 run (smoke test)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the cores the load leaves free)")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES) + ["auto"], default="auto",
                   help="auto (default, as the demo): drafter.auto_dtype(B) for each batch size B")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--name", default="batch", help="output file stem")
    a = p.parse_args(argv)
    if a.quick:
        a.batches, a.runs, a.max_new_tokens, a.rows = [1, 2, 8], 1, 16, 8
    configs = parse_configs(a.configs)
    threads, warning = choose_threads(a.threads)
    torch.set_num_threads(threads)
    if warning:
        print(f"# WARNING: {warning}", file=sys.stderr)
    base_rows = a.rows or max(a.batches)
    n_rows = {B: -(-max(B, base_rows) // B) * B for B in a.batches}  # whole batches of B

    target, drafter, text, desc = load_named(a.model, a.drafter, DTYPES.get(a.drafter_dtype))
    if a.target == "hf":
        from redrafter_ext.adapters.hf import HFTarget
        from redrafter_ext.hub import model_folder

        folder = CHECKPOINTS / "target" if a.model == "tiny" else model_folder(a.model)
        target = HFTarget.from_pretrained(folder, dtype=torch.float32)
        desc += " via transformers (adapters.hf)"
    M, greedy = a.max_new_tokens, a.temperature == 0.0
    sampling = dict(temperature=a.temperature, seed=a.seed)
    prompts = mixed_prompts(text, max(n_rows.values()), target.vocab_size)

    def ar(rows, eos=None):
        return rx.autoregressive_generate(target, rows, M, eos_id=eos, **sampling)

    free = None
    if a.eos == "auto" and text.kind == "chat":
        eos = target.config.eos_token_id
    elif a.eos == "auto":
        free = [rx.autoregressive_generate(target, [q], M).tokens[0] for q in prompts]
        eos = pick_eos(free, M)
    elif a.eos == "model":
        eos = target.config.eos_token_id
    elif a.eos == "none":
        eos = None
    else:
        eos = int(a.eos)
    ref = None
    if greedy:  # batch-1 AR: every method must reproduce it row by row
        if free is not None:  # greedy AR with an EOS is the free-running output cut after the first EOS
            ref = [r[: r.index(eos) + 1] if eos in r else r for r in free]
        else:
            ref = [ar([q], eos).tokens[0] for q in prompts]
    policy = SpeculationPolicy(menu=((1, 1), *configs))
    ddt = "auto (drafter.auto_dtype per B)" if a.drafter_dtype == "auto" else next(drafter.parameters()).dtype
    mode = "greedy" if greedy else f"sampling T={a.temperature} seed={a.seed}"
    print(f"# {desc}; {cpu_name()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {mode}; static "
          f"{' '.join(f'{w}x{length}' for w, length in configs)} and the policy over them plus 1x1; lookup {a.lookup}; "
          f"drafter {ddt}; "
          f"rows per B {n_rows}; {len(prompts)} prompts of {min(map(len, prompts))}..{max(map(len, prompts))} "
          f"tokens; eos={eos}; max {M} new tokens; median of {a.runs} interleaved rounds; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    print(" | ".join(HEADER), flush=True)

    a.out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = a.out / f"{a.name}.csv", a.out / f"{a.name}.png"
    rows = []
    with open(csv_path, "w", newline="") as f:  # written row by row: an interrupted run keeps its rows
        writer = csv.DictWriter(f, fieldnames=HEADER)
        writer.writeheader()
        for B in a.batches:
            if a.drafter_dtype == "auto":
                drafter.to_auto_dtype(B)
            ddt_b = str(next(drafter.parameters()).dtype).removeprefix("torch.")
            work = prompts[: n_rows[B]]
            methods = {"ar": lambda rows_: ar(rows_, eos)}
            for w, length in configs:
                methods[f"{w}x{length}"] = lambda rows_, w=w, length=length: rx.generate(
                    target, drafter, rows_, M, beam_width=w, beam_length=length, eos_id=eos, lookup=a.lookup, **sampling)
            if not a.no_policy:
                methods["policy"] = lambda rows_: rx.generate(target, drafter, rows_, M, policy=policy, eos_id=eos,
                                                              lookup=a.lookup, **sampling)
            names = list(methods)
            for name in names:  # correctness first (and warm-up; the policy calibrates here)
                got = run(methods[name], work, B)["tokens"]
                if greedy and got != ref[: len(work)]:
                    bad = next(i for i, (x, y) in enumerate(zip(got, ref)) if x != y)
                    print(f"MISMATCH: {name} at B={B}, row {bad} differs from batch-1 AR", file=sys.stderr)
                    return 1
            res = {name: [] for name in names}
            load0 = os.getloadavg()[0]
            for i in range(a.runs):  # every method once per round, interleaved batch by batch
                for name, r in run_round(methods, names, work, B, i).items():
                    res[name].append(r)
            load = round((load0 + os.getloadavg()[0]) / 2, 2)
            out_b = {}
            for name in names:
                rs = res[name]
                tps = [r["n"] / r["wall"] for r in rs]
                ratios = [t / (q["n"] / q["wall"]) for t, q in zip(tps, res["ar"])]  # per round
                speedup = statistics.median(ratios)
                tps_step = sum(r["n"] for r in rs) / max(1, sum(r["steps"] for r in rs))
                W, L = (1, 1) if name == "ar" else ("auto", "auto") if name == "policy" else map(int, name.split("x"))
                out_b[name] = {
                    "method": name, "B": B, "W": W, "L": L, "rows": len(work),
                    "tokens": round(statistics.mean(r["n"] for r in rs)), "tok_s": statistics.median(tps),
                    "tok_s_spread": f"{min(tps):.1f}..{max(tps):.1f}",
                    "ms_per_token": statistics.median(r["lat"] for r in rs), "tokens_per_step": tps_step,
                    "idle_steps": max(r["idle"] for r in rs),
                    "speedup": speedup, "speedup_spread": f"{min(ratios):.2f}..{max(ratios):.2f}",
                    "suspect": "speedup>tokens/step" if speedup > tps_step * 1.0001 else "",
                    "best_static": "", "vs_best": "", "temperature": a.temperature,
                    "drafter_dtype": ddt_b if name != "ar" else "", "threads": torch.get_num_threads(),
                    "loadavg1": load,
                }
            statics = [out_b[f"{w}x{length}"] for w, length in configs]
            best = max(statics, key=lambda r: r["speedup"], default=None)
            if "policy" in out_b and best is not None:
                pol = out_b["policy"]
                # per round, as the speedups: the policy's tokens/s over the best static shape's
                vs = [(p["n"] / p["wall"]) / (b["n"] / b["wall"]) for p, b in zip(res["policy"], res[best["method"]])]
                pol.update(best_static=best["method"], vs_best=statistics.median(vs))
            for r in out_b.values():
                if r["suspect"]:
                    print(f"# SUSPECT: {r['method']} at B={B}: speedup {r['speedup']:.2f}x exceeds "
                          f"{r['tokens_per_step']:.2f} tokens/step", file=sys.stderr)
                rows.append(r)
                writer.writerow(r)
                f.flush()
                print(" | ".join(f"{r[h]:.2f}" if isinstance(r[h], float) else str(r[h]) for h in HEADER), flush=True)
    pol = [r for r in rows if r["method"] == "policy"]
    if pol:
        miss = [r for r in pol if r["speedup"] < 0.95 or (r["vs_best"] != "" and r["vs_best"] < 0.95)]
        print(f"# policy >= 0.95x AR and >= 0.95x the best static shape at {len(pol) - len(miss)} of {len(pol)} "
              "batch sizes" + (": missed at " + ", ".join(f"B={r['B']} ({r['speedup']:.2f}x AR, {r['vs_best']:.2f}x "
                                                           f"{r['best_static']})" for r in miss) if miss else ""))
    loads = [r["loadavg1"] for r in rows]
    plot(rows, png_path, f"{a.model}, {mode}: static {' '.join(a.configs)}, policy; drafter {ddt}, max {M} new "
         f"tokens, {torch.get_num_threads()} threads, load {min(loads, default=0):.1f}..{max(loads, default=0):.1f}")
    print(f"# wrote {csv_path} and {png_path}")
    return 0


def _spread(r) -> tuple[float, float]:
    lo, hi = map(float, r["speedup_spread"].split(".."))
    # the spread is stored rounded to 2 decimals: clamp so it still brackets the median
    return max(0.0, r["speedup"] - lo), max(0.0, hi - r["speedup"])


def plot(rows, path: Path, subtitle: str) -> None:
    """Two panels against batch size: throughput of every method, and the speedup over AR of AR
    (1), the best static shape at each B and the policy (median and min..max over rounds)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for name in dict.fromkeys(r["method"] for r in rows):
        rs = sorted((r for r in rows if r["method"] == name), key=lambda r: r["B"])
        style = "s--" if name == "ar" else "o-" if name == "policy" else ".:"
        axes[0].plot([r["B"] for r in rs], [r["tok_s"] for r in rs], style, label=name)
    bs = sorted({r["B"] for r in rows})
    axes[1].axhline(1.0, color="gray", lw=1.0, ls="--", label="ar")
    best = [max((r for r in rows if r["B"] == B and r["method"] not in ("ar", "policy")),
                key=lambda r: r["speedup"], default=None) for B in bs]
    series = [("best static", "s:", [r for r in best if r is not None])]
    series.append(("policy", "o-", sorted((r for r in rows if r["method"] == "policy"), key=lambda r: r["B"])))
    for label, style, rs in series:
        if not rs:
            continue
        err = list(zip(*map(_spread, rs)))
        axes[1].errorbar([r["B"] for r in rs], [r["speedup"] for r in rs], yerr=err, fmt=style, capsize=3, label=label)
        if label == "best static":
            for r in rs:
                axes[1].annotate(r["method"], (r["B"], r["speedup"]), textcoords="offset points", xytext=(4, -10),
                                 fontsize=7)
    for ax, title, ylabel in zip(axes, ("throughput (sum over rows)", "speedup over AR at equal batch (min..max)"),
                                 ("tokens/s", "x")):
        ax.set_xscale("log", base=2)
        ax.set(title=title, xlabel="batch size", ylabel=ylabel)
        ax.legend(fontsize=8)
    fig.suptitle(subtitle, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
