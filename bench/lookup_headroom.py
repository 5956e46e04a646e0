"""How much a context-lookup beam could add to the drafter, on held-out greedy answers.

    ./run.sh bench bench/lookup_headroom.py [--drafter FOLDER] [--shapes 1x4,2x4,4x5] [--beam-n 2]

For every answer position j of the target's greedy answers to the 32 hand-written held-out prompts
(generated into the user cache by `./run.sh train evaluate` on first use), it compares two guesses of
token j: the drafter's look-ahead-1 argmax (from the target state that predicted token j-1 and token
j-1 itself), and a prompt-lookup guess (the token that followed the last earlier occurrence of the
previous n tokens in prompt + answer so far; none when they never occurred). One row per n: the
share of positions with a lookup guess, the share it gets right, the drafter's share, and the share
either gets right, an upper bound on what one extra lookup beam in the trie could accept at depth 1.
Then, per ``--shapes`` W x L, the tokens per step a verify would accept (teacher-forced on the greedy
answer, as `evaluate` counts them) from the drafter's W beams alone; from those with the lookup drafts
in the last beam's place where a key occurred, as ``decode_step(lookup=--beam-n)`` does (the same N
nodes); and, for comparison, from the W beams plus an appended lookup beam (N + L-1 nodes, the
decoder's first design). The drafts are ``ops.ngram_lookup``'s: the L-1 tokens after the latest
earlier occurrence of the longest key of at most ``--beam-n`` tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from tqdm.auto import tqdm

from redrafter_ext import ops
from redrafter_ext.decode import lookup_in_last_beam
from redrafter_ext.drafter import Drafter
from redrafter_ext.hub import cache_dir
from redrafter_ext.train.chat_data import load_chat_data
from redrafter_ext.train.common import accepted_tokens, load_target
from redrafter_ext.train.selfgen import records
from redrafter_ext.train.teacher import features

SHIPPED = Path(__file__).resolve().parents[1] / "python/redrafter_ext/checkpoints/smollm2-135m-instruct-drafter"


def lookup_beam(ctx: list[int], n: int, length: int) -> list[int]:
    """Up to ``length`` tokens after the last earlier occurrence of ``ctx[-n:]`` (empty if none)."""
    key = ctx[-n:]
    for s in range(len(ctx) - n - 1, -1, -1):
        if ctx[s : s + n] == key:
            return ctx[s + n : s + n + length]
    return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", default=str(SHIPPED))
    ap.add_argument("--n", default="1,2,3", help="lookup key lengths")
    ap.add_argument("--cache", default=None, help="the hand-written answers (default: the user cache)")
    ap.add_argument("--selfgen", default=None, help="instead: greedy answers in a selfgen folder (e.g. the ShareGPT "
                    "held-out one: selfgen --sources sharegpt-heldout --temperatures 0), the states recomputed in float32")
    ap.add_argument("--max-answers", type=int, default=64, help="with --selfgen: the first this many answers")
    ap.add_argument("--shapes", default="1x4,2x4,4x5", help="W x L of the drafter's beams")
    ap.add_argument("--beam-n", type=int, default=2, help="the lookup beam's longest key (decode_step's lookup)")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    folder = Path(a.cache) if a.cache else cache_dir() / "heldout" / "smollm2-135m-instruct"
    model, tok, _ = load_target("smollm2-135m-instruct")
    E = model.get_input_embeddings().weight.detach().float()
    if a.selfgen:
        recs = []
        with torch.no_grad():
            for r in tqdm(records(a.selfgen, tok)[: a.max_answers], desc="target states", unit="answer"):
                ids, P = r["prompt"] + r["answer"], len(r["prompt"])
                h, _ = features(model, [ids], torch.float32)
                recs.append({"tokens": torch.tensor(ids), "prompt_len": P, "hidden": h[0, P - 1 : len(ids) - 1]})
    else:  # each: tokens (prompt + answer), prompt_len, hidden[i] predicting token P + i
        recs = load_chat_data(folder)
    d = Drafter.from_pretrained(a.drafter, dtype=torch.float32).eval()
    # the drafter's look-ahead-1 guess of every answer token after the first, one batch per answer
    rows = []
    with torch.no_grad():
        for r in recs:
            t, P, h = r["tokens"].long(), r["prompt_len"], r["hidden"].float()
            js = torch.arange(P + 1, len(t))
            state = d.rnn_step(E[t[js - 1]], torch.zeros(len(js), E.shape[1]))
            guess = d.to_real_ids(d.logits(h[js - 1 - P], state).argmax(-1))
            rows.append((t.tolist(), P, guess.tolist()))
    print(f"{'n':>2} {'positions':>9} {'lookup proposes':>15} {'lookup right':>12} {'precision':>9} "
          f"{'drafter right':>13} {'either right':>12}")
    for n in (int(x) for x in a.n.split(",")):
        tot = prop = right = dr = either = 0
        for t, P, guess in rows:
            for j, g in zip(range(P + 1, len(t)), guess):
                lk = lookup_beam(t[:j], n, 1)
                ok_l, ok_d = lk == [t[j]], g == t[j]
                tot += 1
                prop += bool(lk)
                right += ok_l
                dr += ok_d
                either += ok_l or ok_d
        print(f"{n:>2} {tot:>9} {prop / tot:>15.3f} {right / tot:>12.3f} {right / max(prop, 1):>9.3f} "
              f"{dr / tot:>13.3f} {either / tot:>12.3f}")
    print(f"\n{'shape':>5} {'positions':>9} {'drafter tokens/step':>19} {'+ appended lookup beam':>22} "
          f"{'decode_step(lookup): beam W':>27}")
    for shape in a.shapes.split(","):
        W, L = (int(x) for x in shape.split("x"))
        n_pos = plain = plus = instead = 0
        with torch.no_grad():
            for r in recs:
                t, P, h = r["tokens"].long(), r["prompt_len"], r["hidden"].float()
                js = torch.arange(P + 1, len(t))
                beams = d.beam_search(h[js - 1 - P], t[js - 1].to(torch.int32), E, W, L, ops)[:, :, 1:]
                # the decoder's lookup beam at every position: history t[:j], which ends with the guaranteed token
                lookup = ops.ngram_lookup(t.expand(len(js), -1), js, a.beam_n, L - 1)  # (positions, L-1), -1: none
                # the answer's next L-1 tokens, -2 past its end: no draft (tokens, "none" -1) matches it
                idx = js[:, None] + torch.arange(L - 1)
                truth = torch.where(idx < len(t), t[idx.clamp(max=len(t) - 1)], -2)
                n_pos += len(js)
                plain += accepted_tokens(beams, truth).sum().item()
                plus += accepted_tokens(torch.cat([beams.long(), lookup[:, None].long()], 1), truth).sum().item()
                # the same nodes as the drafter alone: the decoder's rule, the lookup drafts in the last beam's place
                instead += accepted_tokens(lookup_in_last_beam(beams, lookup).long(), truth).sum().item()
        print(f"{shape:>5} {n_pos:>9} {plain / n_pos:>19.2f} {plus / n_pos:>22.2f} {instead / n_pos:>27.2f}")


if __name__ == "__main__":
    main()
