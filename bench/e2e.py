"""End-to-end benchmark: AR vs ReDrafter on the shipped model over a (W, L, batch) grid.

    python bench/e2e.py [--quick] [--runs 5] [--max-new-tokens 96] [--out bench/results]
    python bench/e2e.py --temperature 1 [--top-k 0 --top-p 1 --seed 0]   # sampling

For every configuration: outputs are first checked identical to AR (greedy only: sampled outputs
differ token for token, they agree in distribution), then each method is timed ``--runs`` times;
the table gives median tokens/s with the spread (min-max), speedup, mean tokens per step and trie
nodes per step. With sampling both methods sample with the same options and seed, and each one's
tokens/s counts its own output (the lengths can differ through EOS). Writes ``e2e.csv`` and
``e2e.png`` (speedup and tokens/step vs W, L).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

import redrafter_ext as rx
from redrafter_ext.demo import CHECKPOINTS, DTYPES, load_models, load_prompt_ids
from redrafter_ext.profiling import STAGES, StageTimer


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--lengths", type=int, nargs="+", default=[2, 3, 4, 5, 6])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=8, help="prompts per run (a multiple of the batch is used)")
    p.add_argument("--quick", action="store_true", help="a small grid, 3 runs (smoke test)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES), default="checkpoint")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    p.add_argument("--temperature", "-T", type=float, default=0.0, help="0: greedy (default); > 0: sampling")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling: seed of the uniforms")
    a = p.parse_args(argv)
    sampling = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, seed=a.seed)
    greedy = a.temperature == 0.0
    if a.quick:
        a.widths, a.lengths, a.batches, a.runs, a.max_new_tokens, a.prompts = [1, 4], [2, 4], [1, 4], 3, 48, 4

    if a.threads:
        torch.set_num_threads(a.threads)
    target, drafter, tok, desc = load_models(a.checkpoints, random_weights=False, drafter_dtype=DTYPES[a.drafter_dtype])
    eos = target.config.eos_token_id
    a.out.mkdir(parents=True, exist_ok=True)
    print(f"# {desc}; torch {torch.__version__}, {torch.get_num_threads()} threads; median of {a.runs} runs, "
          f"spread = min..max; {a.max_new_tokens} new tokens per prompt; "
          + ("greedy" if greedy else f"sampling T={a.temperature} top_k={a.top_k} top_p={a.top_p} seed={a.seed}"))
    header = ["B", "W", "L", "N", "ar_tok_s", "ar_spread", "rd_tok_s", "rd_spread", "speedup", "tokens_per_step",
              "nodes_per_step", *[f"ms_{s}" for s in STAGES]]
    print(" | ".join(header))
    rows = []
    # rows are written as they come, so a long grid that is interrupted keeps what it measured
    csv_file = open(a.out / "e2e.csv", "w", newline="")  # noqa: SIM115
    writer = csv.DictWriter(csv_file, fieldnames=header)
    writer.writeheader()
    for B in a.batches:
        prompts = load_prompt_ids(tok, max(a.prompts, B) // B * B, 200, target.vocab_size)
        batches = [prompts[i : i + B] for i in range(0, len(prompts), B)]
        rx.autoregressive_generate(target, batches[0], 4, eos_id=eos, **sampling)  # warm-up
        def run_ar(batches=batches):
            return [rx.autoregressive_generate(target, c, a.max_new_tokens, eos_id=eos, **sampling) for c in batches]

        ar_times = []
        for _ in range(a.runs):
            outs, t = timed(run_ar)
            ar_times.append(t)
        ar_tokens = [row for o in outs for row in o.tokens]
        n_tok = sum(map(len, ar_tokens))
        ar_tps = [n_tok / t for t in ar_times]
        for W in a.widths:
            for L in a.lengths:
                N = 1 + W * (L - 1)

                def gen(timer=None, W=W, L=L, batches=batches):
                    return [
                        rx.generate(target, drafter, c, a.max_new_tokens, beam_width=W, beam_length=L, eos_id=eos,
                                    timer=timer, **sampling)
                        for c in batches
                    ]

                timer = StageTimer()
                first = gen(timer)  # correctness first (and the stage split)
                got = [row for o in first for row in o.tokens]
                if greedy and got != ar_tokens:
                    print(f"MISMATCH at B={B} W={W} L={L}: ReDrafter output differs from AR", file=sys.stderr)
                    return 1
                rd_tok = sum(map(len, got))  # == n_tok when greedy; a seed fixes it when sampling
                steps = sum(sum(o.steps) for o in first)
                nodes = sum(sum(o.nodes) for o in first)
                rd_times = [timed(gen)[1] for _ in range(a.runs)]
                rd_tps = [rd_tok / t for t in rd_times]
                split = timer.split()
                row_steps = max(1, steps // B)  # batched steps: rows advance together
                r = {
                    "B": B, "W": W, "L": L, "N": N,
                    "ar_tok_s": statistics.median(ar_tps), "ar_spread": f"{min(ar_tps):.1f}..{max(ar_tps):.1f}",
                    "rd_tok_s": statistics.median(rd_tps), "rd_spread": f"{min(rd_tps):.1f}..{max(rd_tps):.1f}",
                    "speedup": statistics.median(rd_tps) / statistics.median(ar_tps),
                    "tokens_per_step": rd_tok / max(1, steps), "nodes_per_step": nodes / max(1, steps),
                    **{f"ms_{s}": 1e3 * split[s] / row_steps for s in STAGES},
                }
                rows.append(r)
                writer.writerow(r)
                csv_file.flush()
                print(" | ".join(f"{r[h]:.2f}" if isinstance(r[h], float) else str(r[h]) for h in header), flush=True)

    csv_file.close()
    best = max((r for r in rows if r["B"] == 1), key=lambda r: r["speedup"], default=None)
    if best:
        print(f"# best at batch 1: W={best['W']} L={best['L']}: {best['speedup']:.2f}x, "
              f"{best['tokens_per_step']:.2f} tokens/step")
    plot(rows, a.out / "e2e.png")
    print(f"# wrote {a.out / 'e2e.csv'} and {a.out / 'e2e.png'}")
    return 0


def plot(rows, path: Path) -> None:
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
        for W in sorted({r["W"] for r in rows}):
            rs = sorted((r for r in rows if r["B"] == B and r["W"] == W), key=lambda r: r["L"])
            axes[0][j].plot([r["L"] for r in rs], [r["speedup"] for r in rs], marker="o", label=f"W={W}")
            axes[1][j].plot([r["L"] for r in rs], [r["tokens_per_step"] for r in rs], marker="o", label=f"W={W}")
        axes[0][j].axhline(1.0, color="gray", lw=0.8)
        axes[0][j].set(title=f"batch {B}: speedup over AR", xlabel="beam length L", ylabel="speedup")
        axes[1][j].set(title=f"batch {B}: tokens per step", xlabel="beam length L", ylabel="tokens/step")
        axes[0][j].legend()
        axes[1][j].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
