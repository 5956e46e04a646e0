"""End-to-end benchmark: AR vs ReDrafter over a (W, L, batch) grid, timed interleaved.

    python bench/e2e.py [--model smollm2-135m-instruct|tiny|PATH] [--quick] [--runs 3] [--out bench/results]
    python bench/e2e.py --temperature 0.7 [--top-k 0 --top-p 1 --seed 0]   # sampling

For every configuration: outputs are first checked identical to AR (greedy only: sampled outputs
differ token for token, they agree in distribution; with ``--dtype bfloat16`` a mismatch is reported
in ``rows_equal_ar`` instead of stopping the run); then AR and ReDrafter are timed alternately
``--runs`` times each in this one process (AR, ReDrafter, ReDrafter, AR, ...), so that a change of
machine load hits both alike, and the speedup is the median of the per-pair ratios with its spread
(min..max). Every row records the 1-minute load average and the torch thread count. A speedup above
tokens per step is impossible for a step that costs at least one AR step, so such a row is flagged
``suspect`` (a timing artefact, e.g. a load change inside a pair). Unless ``--no-policy``, a last row
per batch size (W = L = ``auto``) runs the adaptive ``SpeculationPolicy`` (default menu; one policy
for the whole run) the same way; its ``vs_best`` is its speedup over the best fixed (W, L) row's.
Writes ``e2e.csv`` and ``e2e.png`` (speedup with min..max error bars, and tokens/step vs W, L, the
policy as a horizontal line; load and threads in the title).
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
from redrafter_ext._shape_checks import menu_nodes_max, num_nodes_max
from redrafter_ext.demo import DEFAULT_MODEL, DTYPES, load_named
from redrafter_ext.policy import SpeculationPolicy
from redrafter_ext.profiling import STAGES, StageTimer, choose_threads, cpu_name

HEADER = ["B", "W", "L", "lookup", "N", "ar_tok_s", "ar_spread", "rd_tok_s", "rd_spread", "speedup", "speedup_min",
          "speedup_max", "tokens_per_step", "nodes_per_step", "suspect", "rows_equal_ar", "vs_best", *[f"ms_{s}" for s in STAGES],
          "threads", "loadavg1"]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def interleaved(run_ar, run_rd, runs: int) -> tuple[list[float], list[float]]:
    """Seconds of ``runs`` AR and ReDrafter runs, alternating (AR first in even pairs, second in odd)."""
    t_ar, t_rd = [], []
    for i in range(runs):
        if i % 2 == 0:
            t_ar.append(timed(run_ar)[1])
            t_rd.append(timed(run_rd)[1])
        else:
            t_rd.append(timed(run_rd)[1])
            t_ar.append(timed(run_ar)[1])
    return t_ar, t_rd


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=DEFAULT_MODEL, help="smollm2-135m-instruct, tiny, or a Hugging Face Llama folder")
    p.add_argument("--drafter", default=None, help="drafter folder (default: the one shipped for --model)")
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--lengths", type=int, nargs="+", default=[3, 4, 5, 6])
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--runs", type=int, default=3, help="timed runs of each method per configuration")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts per run (a multiple of the batch is used)")
    p.add_argument("--quick", action="store_true", help="a small grid, 2 runs (smoke test)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: the cores the load leaves free)")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES) + ["auto"], default="auto",
                   help="auto: drafter.auto_dtype(B) for each batch size B")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="target dtype (greedy equality with AR is only promised in float32)")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--lookup", type=int, nargs="+", default=[0, 2],
                   help="the prompt-lookup beam's key length for generate(lookup=...), 0: none; several: one row each")
    p.add_argument("--no-policy", action="store_true",
                   help="skip the adaptive policy's row (beam_width=beam_length='auto', default menu)")
    p.add_argument("--temperature", "-T", type=float, default=0.0, help="0: greedy (default); > 0: sampling")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling: seed of the uniforms")
    a = p.parse_args(argv)
    sampling = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed)
    greedy = a.temperature == 0.0
    if a.quick:
        a.widths, a.lengths, a.batches, a.runs, a.max_new_tokens, a.prompts = [1, 2], [3, 5], [1], 2, 32, 2

    threads, warning = choose_threads(a.threads)
    torch.set_num_threads(threads)
    if warning:
        print(f"# WARNING: {warning}", file=sys.stderr)
    target, drafter, text, desc = load_named(a.model, a.drafter, DTYPES.get(a.drafter_dtype))
    if a.dtype == "bfloat16":
        target = target.to(torch.bfloat16)
    eos = target.config.eos_token_id
    a.out.mkdir(parents=True, exist_ok=True)
    mode = "greedy" if greedy else f"sampling T={a.temperature} top_k={a.top_k} top_p={a.top_p} seed={a.seed}"
    ddt = "auto (drafter.auto_dtype per B)" if a.drafter_dtype == "auto" else next(drafter.parameters()).dtype
    print(f"# {desc}; {cpu_name()}; target {a.dtype}; torch {torch.__version__}, {threads} threads, load "
          f"{os.getloadavg()[0]:.2f} at start; {a.runs} interleaved runs per method, spread = min..max; "
          f"{a.max_new_tokens} new tokens per prompt; drafter {ddt}; {mode}")
    print(" | ".join(HEADER))
    rows = []
    # rows are written as they come, so a long grid that is interrupted keeps what it measured
    csv_file = open(a.out / "e2e.csv", "w", newline="")  # noqa: SIM115
    writer = csv.DictWriter(csv_file, fieldnames=HEADER)
    writer.writeheader()
    # one policy for the whole run, as an engine keeps one: it calibrates once per row bucket
    policy = None if a.no_policy else SpeculationPolicy()
    for B in a.batches:
        if a.drafter_dtype == "auto":
            drafter.to_auto_dtype(B)
        prompts = [ids for _, ids in text.heldout(max(a.prompts, B) // B * B)]
        batches = [prompts[i : i + B] for i in range(0, len(prompts), B)]
        rx.autoregressive_generate(target, batches[0], 4, eos_id=eos, **sampling)  # warm-up

        def run_ar(batches=batches):
            return [rx.autoregressive_generate(target, c, a.max_new_tokens, eos_id=eos, **sampling) for c in batches]

        ar_tokens = [row for o in run_ar() for row in o.tokens]
        n_tok = sum(map(len, ar_tokens))

        def measure(W, L, N, gen, lookup, B=B, ar_tokens=ar_tokens, n_tok=n_tok, run_ar=run_ar):
            """Check ``gen`` against AR (greedy), time it interleaved with AR, write its row."""
            timer = StageTimer()
            first = gen(timer)  # correctness first (and the stage split; the policy calibrates here)
            got = [row for o in first for row in o.tokens]
            same = sum(x == y for x, y in zip(got, ar_tokens))
            if greedy and got != ar_tokens:
                print(f"MISMATCH at B={B} W={W} L={L}: ReDrafter output differs from AR in "
                      f"{len(got) - same}/{len(got)} rows", file=sys.stderr)
                if a.dtype == "float32":
                    return False
            rd_tok = sum(map(len, got))  # == n_tok when greedy; a seed fixes it when sampling
            steps = sum(sum(o.steps) for o in first)
            nodes = sum(sum(o.nodes) for o in first)
            load0 = os.getloadavg()[0]
            t_ar, t_rd = interleaved(run_ar, gen, a.runs)
            load = (load0 + os.getloadavg()[0]) / 2
            ar_tps = [n_tok / t for t in t_ar]
            rd_tps = [rd_tok / t for t in t_rd]
            ratios = [r / q for r, q in zip(rd_tps, ar_tps)]
            split = timer.split()
            row_steps = max(1, steps // B)  # batched steps: rows advance together
            tps = rd_tok / max(1, steps)
            speedup = statistics.median(ratios)
            r = {
                "B": B, "W": W, "L": L, "lookup": lookup, "N": N,
                "ar_tok_s": statistics.median(ar_tps), "ar_spread": f"{min(ar_tps):.1f}..{max(ar_tps):.1f}",
                "rd_tok_s": statistics.median(rd_tps), "rd_spread": f"{min(rd_tps):.1f}..{max(rd_tps):.1f}",
                "speedup": speedup, "speedup_min": min(ratios), "speedup_max": max(ratios),
                "tokens_per_step": tps, "nodes_per_step": nodes / max(1, steps),
                "suspect": "speedup>tokens/step" if speedup > tps else "",
                "rows_equal_ar": f"{same}/{len(got)}" if greedy else "", "vs_best": "",
                **{f"ms_{s}": 1e3 * split[s] / row_steps for s in STAGES},
                "threads": threads, "loadavg1": round(load, 2),
            }
            if W == "auto":
                best = max((q for q in rows if q["B"] == B and q["W"] != "auto" and q["lookup"] == lookup),
                           key=lambda q: q["speedup"],
                           default=None)
                r["vs_best"] = speedup / best["speedup"] if best else ""
            if r["suspect"]:
                print(f"# SUSPECT: B={B} W={W} L={L}: speedup {speedup:.2f}x exceeds {tps:.2f} tokens/step "
                      "(impossible when a step costs at least one AR step): a load change during timing?",
                      file=sys.stderr)
            rows.append(r)
            writer.writerow(r)
            csv_file.flush()
            print(" | ".join(f"{r[h]:.2f}" if isinstance(r[h], float) else str(r[h]) for h in HEADER), flush=True)
            return True

        for lookup in a.lookup:
            for W in a.widths:
                for L in a.lengths:

                    def gen(timer=None, W=W, L=L, batches=batches, lookup=lookup):
                        return [
                            rx.generate(target, drafter, c, a.max_new_tokens, beam_width=W, beam_length=L, eos_id=eos,
                                        timer=timer, lookup=lookup, **sampling)
                            for c in batches
                        ]

                    if not measure(W, L, num_nodes_max(W, L), gen, lookup):
                        return 1
        for lookup in a.lookup if policy is not None else ():
            # one policy per lookup setting: its cost and acceptance figures depend on it
            pol = policy if lookup == a.lookup[0] else SpeculationPolicy()

            def gen_policy(timer=None, batches=batches, lookup=lookup, pol=pol):
                return [rx.generate(target, drafter, c, a.max_new_tokens, policy=pol, eos_id=eos, timer=timer,
                                    lookup=lookup, **sampling) for c in batches]

            if not measure("auto", "auto", menu_nodes_max(pol.menu), gen_policy, lookup):
                return 1

    csv_file.close()
    best = max((r for r in rows if r["B"] == 1 and not r["suspect"] and r["W"] != "auto"), key=lambda r: r["speedup"], default=None)
    if best:
        print(f"# best at batch 1: W={best['W']} L={best['L']} lookup={best['lookup']}: {best['speedup']:.2f}x "
              f"({best['speedup_min']:.2f}..{best['speedup_max']:.2f}), {best['tokens_per_step']:.2f} tokens/step")
    loads = [r["loadavg1"] for r in rows]
    title = (f"{a.model}, {mode}, target {a.dtype}; {threads} threads, load {min(loads, default=0):.1f}.."
             f"{max(loads, default=0):.1f}")
    plot(rows, a.out / "e2e.png", title)
    print(f"# wrote {a.out / 'e2e.csv'} and {a.out / 'e2e.png'}")
    return 0


def plot(rows, path: Path, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# matplotlib missing: no plot", file=sys.stderr)
        return
    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(2, len(batches), figsize=(5 * len(batches), 8), squeeze=False)
    for j, B in enumerate(batches):
        for W in sorted({r["W"] for r in rows if r["W"] != "auto"}):
            rs = sorted((r for r in rows if r["B"] == B and r["W"] == W), key=lambda r: r["L"])
            sp = [r["speedup"] for r in rs]
            err = [[max(0.0, s - r["speedup_min"]) for s, r in zip(sp, rs)],
                   [max(0.0, r["speedup_max"] - s) for s, r in zip(sp, rs)]]
            axes[0][j].errorbar([r["L"] for r in rs], sp, yerr=err, marker="o", capsize=3, label=f"W={W}")
            axes[1][j].plot([r["L"] for r in rs], [r["tokens_per_step"] for r in rs], marker="o", label=f"W={W}")
        axes[0][j].axhline(1.0, color="gray", lw=0.8)
        for r in (r for r in rows if r["B"] == B and r["W"] == "auto"):
            axes[0][j].axhline(r["speedup"], color="black", ls="--", lw=1.2, label="policy (auto)")
            axes[1][j].axhline(r["tokens_per_step"], color="black", ls="--", lw=1.2, label="policy (auto)")
        axes[0][j].set(title=f"batch {B}: speedup over AR", xlabel="beam length L", ylabel="speedup")
        axes[1][j].set(title=f"batch {B}: tokens per step", xlabel="beam length L", ylabel="tokens/step")
        axes[0][j].legend()
        axes[1][j].legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
