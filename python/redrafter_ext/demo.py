"""Demo: autoregressive decoding vs ReDrafter on the shipped model (greedy: outputs checked equal).

    python -m redrafter_ext.demo [--beam-width 4 --beam-length 4 --batch-size 1 --max-new-tokens 128]
    python -m redrafter_ext.demo --temperature 0.8 [--top-k 50 --top-p 0.95 --seed 0]

Prints tokens/s of each, the speedup, mean tokens per step (accepted + 1), trie nodes used vs
the maximum N = 1 + W*(L-1), and where a ReDrafter step spends its time. With --temperature > 0 both
sample (ReDrafter by exact rejection over the trie, so its output has the target's distribution):
outputs are not compared token for token, only speed and tokens/step are reported.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from . import ops as native_ops
from . import reference
from .decode import autoregressive_generate, generate
from .drafter import Drafter, DrafterConfig
from .models import LlamaConfig, LlamaTarget
from .profiling import STAGES, StageTimer

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
DTYPES = {"checkpoint": None, "float32": torch.float32, "bfloat16": torch.bfloat16}


def load_models(folder: Path, random_weights: bool, drafter_dtype: torch.dtype | None = None):
    """(target, drafter, tokenizer or None, description). Random weights when none are shipped.

    The target runs in float32 (greedy equality with AR is checked token for token); the drafter in
    ``drafter_dtype`` (default: the checkpoint's, bf16).
    """
    tdir, ddir = folder / "target", folder / "drafter"
    if not random_weights and (tdir / "config.json").is_file() and (ddir / "drafter_config.json").is_file():
        target = LlamaTarget.from_pretrained(tdir, dtype=torch.float32)
        # the drafter runs at small M (W rows), where reading bf16 weights beats float32 compute
        drafter = Drafter.from_pretrained(ddir, dtype=drafter_dtype)
        tok = None
        if (tdir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(tdir / "tokenizer.json"))
        return target, drafter, tok, f"shipped checkpoint {folder}"
    if not random_weights:
        print(f"[demo] no trained checkpoints under {folder}: using random weights "
              "(acceptance and speedup are meaningless; train with `python -m redrafter_ext.train`)", file=sys.stderr)
    torch.manual_seed(0)
    target = LlamaTarget(LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                                     num_attention_heads=4, num_key_value_heads=2)).eval()
    drafter = Drafter(DrafterConfig(128, 1024, 1)).eval()
    return target, drafter, None, "random weights"


def load_prompt_ids(tok, n: int, chars: int, vocab: int) -> list[list[int]]:
    if tok is None:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (16 + 3 * i,), generator=g).tolist() for i in range(n)]  # sync-ok: host prompts
    from .train.corpus import load_prompts

    return [tok.encode(p).ids for p in load_prompts(n, chars=chars, seed=0)]


def n_params(m: torch.nn.Module) -> str:
    return f"{sum(p.numel() for p in m.parameters()) / 1e6:.1f}M"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m redrafter_ext.demo", description=__doc__.split("\n")[0])
    # defaults: the best batch-1 configuration measured on a 2-core CPU (bench/e2e.py), where a
    # wider tree costs more verify time than its extra acceptance buys
    p.add_argument("--beam-width", "-W", type=int, default=1)
    p.add_argument("--beam-length", "-L", type=int, default=8, help="tokens per beam, the guaranteed one included")
    p.add_argument("--batch-size", "-B", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts to decode")
    p.add_argument("--prompt-chars", type=int, default=200)
    p.add_argument("--ops", choices=("native", "reference"), default="native")
    p.add_argument("--checkpoints", type=Path, default=CHECKPOINTS)
    p.add_argument("--random-weights", action="store_true", help="ignore shipped checkpoints")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES) + ["auto"], default="auto",
                   help="drafter compute dtype; auto (default): the checkpoint's bf16 at batch 1, float32 above")
    p.add_argument("--show", type=int, default=1, help="print this many decoded samples")
    p.add_argument("--temperature", "-T", type=float, default=0.0, help="0: greedy (default); > 0: sampling")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling: seed of the uniforms")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    ops = native_ops if a.ops == "native" else reference

    # measured on this project's CPU: bf16 halves the drafter's time at batch 1 (small M: weight
    # reads dominate) but costs ~4x at batch 32 (no bf16 units: compute dominates); bench/results_ref
    dname = a.drafter_dtype if a.drafter_dtype != "auto" else ("checkpoint" if a.batch_size == 1 else "float32")
    target, drafter, tok, desc = load_models(a.checkpoints, a.random_weights, DTYPES[dname])
    eos = target.config.eos_token_id
    prompts = load_prompt_ids(tok, a.prompts, a.prompt_chars, target.vocab_size)
    W, L, B = a.beam_width, a.beam_length, a.batch_size
    N = 1 + W * (L - 1)
    print(f"target: {desc}, {n_params(target)} params ({target.embed_weight.dtype}); drafter: {n_params(drafter)} "
          f"params ({next(drafter.parameters()).dtype}); ops: {a.ops}; torch threads: {torch.get_num_threads()}")
    sampling = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)
    greedy = a.temperature == 0.0
    mode = "greedy" if greedy else f"sampling T={a.temperature} top-k={a.top_k} top-p={a.top_p} seed={a.seed}"
    print(f"W={W} L={L} (N={N} nodes max), batch {B}, {len(prompts)} prompts, max {a.max_new_tokens} new tokens, "
          f"{mode}")

    # warm-up: first calls pay for allocation and kernel selection
    autoregressive_generate(target, prompts[:1], 4, eos_id=eos, **sampling)
    generate(target, drafter, prompts[:1], 4, beam_width=W, beam_length=L, eos_id=eos, ops=ops, **sampling)

    t_ar = t_rd = 0.0
    n_ar = n_rd = steps = nodes = max_nodes = 0
    same = 0
    timer = StageTimer(target.embed_weight.device)
    samples = []
    for s in range(0, len(prompts), B):
        chunk = prompts[s : s + B]
        t0 = time.perf_counter()
        ar = autoregressive_generate(target, chunk, a.max_new_tokens, eos_id=eos, seed=a.seed + s, **sampling)
        t_ar += time.perf_counter() - t0
        t0 = time.perf_counter()
        rd = generate(target, drafter, chunk, a.max_new_tokens, beam_width=W, beam_length=L, eos_id=eos, ops=ops,
                      timer=timer, seed=a.seed + s, **sampling)
        t_rd += time.perf_counter() - t0
        n_ar += sum(map(len, ar.tokens))
        n_rd += sum(map(len, rd.tokens))
        steps += sum(rd.steps)
        nodes += sum(rd.nodes)
        max_nodes = max(max_nodes, int(rd.state.nodes.max()))
        same += sum(x == y for x, y in zip(ar.tokens, rd.tokens))
        samples += list(zip(chunk, rd.tokens))

    tps_ar, tps_rd = n_ar / t_ar, n_rd / t_rd
    rows = [
        ("method", "tokens", "seconds", "tokens/s", "speedup", "tokens/step", "tree nodes mean (N max)"),
        ("AR greedy" if greedy else "AR sampling", str(n_ar), f"{t_ar:.2f}", f"{tps_ar:.1f}", "1.00x", "1.00", "1"),
        ("ReDrafter", str(n_rd), f"{t_rd:.2f}", f"{tps_rd:.1f}", f"{tps_rd / tps_ar:.2f}x",
         f"{n_rd / max(1, steps):.2f}", f"{nodes / max(1, steps):.1f} ({N})"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths)))
    split = timer.split()
    total = sum(split.values())
    print("\nReDrafter time per stage: " + ", ".join(
        f"{k} {1e3 * split[k] / max(1, steps / max(1, B)):.2f} ms/step ({100 * split[k] / total:.0f}%)" for k in STAGES))
    if greedy:
        print(f"\noutputs identical to greedy AR: {same}/{len(prompts)}")
    else:
        print("\nsampling: outputs are samples of the same distribution, not compared token for token")
    for prompt, out in samples[: a.show]:
        if tok is not None:
            print("\n--- prompt ---\n" + tok.decode(prompt) + "\n--- ReDrafter continuation ---\n" + tok.decode(out))
    return 0 if not greedy or same == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
