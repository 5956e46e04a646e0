"""Online serving simulation: Poisson arrivals into an in-flight batch (``rx.Batch``), AR vs ReDrafter.

    python bench/serve.py [--model tiny] [--rates 0.5 2 8] [--requests 16] [--rows 4]

For each arrival rate (requests/s) one arrival trace (seeded) is replayed by every method on the
wall clock: requests are admitted as rows free up, the batch steps, finished rows are retired (the
host reads the done flags once per step, as a scheduler would). Methods: ``ar`` (plain decoding
steps, L = 1), ``static`` (one (W, L)), ``policy`` (a ``SpeculationPolicy`` re-choosing (W, L)
every few steps from measured cost and acceptance). Reported per method and rate: throughput
(generated tokens / makespan), time to first token and time per output token (p50 / p99), with the
load average and thread count. Every request's tokens are checked against its own batch-1 greedy
output before anything is reported. Writes bench/results/serve.csv and serve.png.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import redrafter_ext as rx
from redrafter_ext.policy import PolicyWindows, SpeculationPolicy


def load(model: str):
    """(target, drafter, Text) as the demo and the other benches load them."""
    from redrafter_ext.demo import load_named

    target, drafter, text, _ = load_named(model)
    return target, drafter, text


def prompts_for(text, n: int, rng: np.random.Generator) -> list[list[int]]:
    """n held-out prompts (cycled), chat prompts whole, others cut to 8..95 tokens."""
    held = [ids for _, ids in text.heldout(min(n, 32), 400)]
    out = [held[i % len(held)] for i in range(n)]
    return out if text.kind == "chat" else [p[: int(rng.integers(8, 96))] for p in out]


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else float("nan")


def run(method, target, drafter, reqs, arrivals, args, policy=None):
    """Replays one arrival trace; returns per-request (tokens, ttft, tpot) and the makespan."""
    W, L = args.static
    batch = rx.Batch(target, args.rows, args.max_new, args.max_len,
                     beam_width=max(W, policy.max_width if policy else 1),
                     beam_length=max(L, policy.max_length if policy else 1))
    waiting, row_of, admitted, first, out = [], {}, {}, {}, {}
    t0 = time.perf_counter()
    nxt, entry, left, win_steps = 0, (W, L), 0, 0
    windows = PolicyWindows(policy) if policy else None
    while len(out) < len(reqs):
        now = time.perf_counter() - t0
        while nxt < len(reqs) and arrivals[nxt] <= now:
            waiting.append(nxt)
            nxt += 1
        while waiting and batch.free_rows:
            r = waiting.pop(0)
            row_of[batch.admit(reqs[r], max_new_tokens=args.max_new)] = r
            admitted[r] = time.perf_counter() - t0
        if not batch.busy:  # idle until the next arrival
            time.sleep(max(0.0, arrivals[nxt] - (time.perf_counter() - t0)))
            continue
        if method == "policy" and left == 0:
            st = batch.state
            active = int((~st.done).sum())  # sync-ok: the scheduler's read
            tokens, steps = int(st.num_out.sum()), int(st.steps.sum())
            windows.observe(win_steps, tokens, steps)
            entry, left = windows.choose(active, tokens, steps)
            win_steps = left
        we, le = (1, 1) if method == "ar" else entry
        batch.step(drafter, beam_width=we, beam_length=le)
        left = max(0, left - 1)
        now = time.perf_counter() - t0
        num_out = batch.state.num_out.tolist()  # sync-ok: per-step scheduler read
        for row, r in row_of.items():
            if r not in first and num_out[row] > 0:
                first[r] = now
        for row in batch.finished():
            r = row_of.pop(row)
            out[r] = (batch.retire(row), now)
    makespan = time.perf_counter() - t0
    res = []
    for r in range(len(reqs)):
        toks, done_t = out[r]
        ttft = first[r] - arrivals[r]
        tpot = (done_t - first[r]) / max(1, len(toks) - 1)
        res.append((toks, ttft, tpot))
    return res, makespan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="tiny", help="tiny, smollm2-135m-instruct, or a HF Llama folder")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.5, 2.0, 8.0], help="arrival rates, requests/s")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--rows", type=int, default=4, help="rows of the in-flight batch")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--static", type=int, nargs=2, default=[1, 8], metavar=("W", "L"))
    ap.add_argument("--window", type=int, default=4, help="policy: steps between its decisions")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench/results/serve")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, drafter, text = load(args.model)
    rng = np.random.default_rng(args.seed)
    reqs = prompts_for(text, args.requests, rng)
    want = [rx.autoregressive_generate(target, [p], args.max_new).tokens[0] for p in reqs]
    policy = SpeculationPolicy(window=args.window)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'rate':>5} {'method':>7} {'tok/s':>7} {'ttft p50':>9} {'ttft p99':>9} {'tpot p50':>9} {'tpot p99':>9}  load")
    for rate in args.rates:
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=len(reqs)))
        for method in ("ar", "static", "policy"):  # the same trace for each
            res, makespan = run(method, target, drafter, reqs, arrivals, args, policy)
            for r, (toks, _, _) in enumerate(res):
                assert toks == want[r], f"{method} rate {rate}: request {r} differs from its batch-1 output"
            ttft = [x[1] for x in res]
            tpot = [x[2] for x in res]
            row = dict(rate=rate, method=method, tok_s=sum(len(x[0]) for x in res) / makespan,
                       ttft_p50=pct(ttft, 50), ttft_p99=pct(ttft, 99), tpot_p50=pct(tpot, 50), tpot_p99=pct(tpot, 99),
                       load=os.getloadavg()[0], threads=args.threads, rows=args.rows, model=args.model)
            rows.append(row)
            print(f"{rate:5.1f} {method:>7} {row['tok_s']:7.1f} {row['ttft_p50']:9.3f} {row['ttft_p99']:9.3f} "
                  f"{row['tpot_p50']:9.4f} {row['tpot_p99']:9.4f}  {row['load']:.1f}", flush=True)
    with open(args.out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        for method in ("ar", "static", "policy"):
            rs = [r for r in rows if r["method"] == method]
            ax[0].plot([r["rate"] for r in rs], [r["tok_s"] for r in rs], "o-", label=method)
            ax[1].plot([r["rate"] for r in rs], [r["tpot_p50"] * 1e3 for r in rs], "o-", label=method)
        ax[0].set(xlabel="arrival rate (req/s)", ylabel="throughput (tok/s)", xscale="log")
        ax[1].set(xlabel="arrival rate (req/s)", ylabel="time per output token p50 (ms)", xscale="log")
        ax[0].legend()
        fig.suptitle(f"serve: {args.model}, {args.rows} rows, threads {args.threads}, "
                     f"load {statistics.mean(r['load'] for r in rows):.1f}")
        fig.tight_layout()
        fig.savefig(args.out + ".png", dpi=100)
    except ImportError:
        pass
    print(f"wrote {args.out}.csv")


if __name__ == "__main__":
    main()
