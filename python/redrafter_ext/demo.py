"""Demo: autoregressive decoding vs ReDrafter on a real chat model (greedy: outputs checked equal).

    python -m redrafter_ext.demo                       # SmolLM2-135M-Instruct, 4 held-out prompts, W=auto L=auto
    python -m redrafter_ext.demo -W 1 -L 3             # a fixed draft shape instead of the policy
    python -m redrafter_ext.demo --prompt "Why is the sky blue?"
    python -m redrafter_ext.demo --model tiny          # the small 5M model trained on Python code
    python -m redrafter_ext.demo --model PATH [--drafter PATH]   # any Hugging Face Llama folder
    python -m redrafter_ext.demo --temperature 0.7 [--top-k 50 --top-p 0.95 --seed 0]

Per prompt: the prompt and the response (truncated), AR and ReDrafter tokens/s (timed alternately
in one process), the speedup, tokens per step (accepted + 1) and where a ReDrafter step spends its
time. By default (W and L "auto") a ``SpeculationPolicy`` picks the draft shape as it goes, from
measured step time and acceptance, plain decoding included, so that ReDrafter is not slower than
AR where drafting cannot pay; one policy serves every prompt, as an engine keeps one. With --temperature > 0 both sample (ReDrafter by exact rejection over the trie, so its output
has the target's distribution): outputs are not compared token for token.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from . import ops as native_ops
from . import reference
from ._generate_common import policy_arg
from ._shape_checks import LOOKUP_DEFAULT, menu_nodes_max, num_nodes_max
from .corpus import load_prompts
from .decode import autoregressive_generate, generate
from .drafter import Drafter, DrafterConfig, auto_dtype
from .hub import CHECKPOINTS, load_model, model_folder
from .models import LlamaConfig, LlamaTarget
from .profiling import STAGES, StageTimer, choose_threads, load_and_threads
from .prompts import chat_prompt_ids, heldout_prompts

DTYPES = {"checkpoint": None, "float32": torch.float32, "bfloat16": torch.bfloat16}
DEFAULT_MODEL = "smollm2-135m-instruct"


def load_models(folder: Path, random_weights: bool, drafter_dtype: torch.dtype | None = None):
    """The small shipped model: (target, drafter, ``tokenizers.Tokenizer`` or None, description).
    Random weights when none are shipped.

    The target runs in float32 (greedy equality with AR is checked token for token); the drafter in
    ``drafter_dtype`` (default: the checkpoint's, bf16). Not ``hub.load_model("tiny")``: this keeps
    the ``tokenizers.Tokenizer`` that ``load_prompt_ids`` encodes with, no column-major weight copies
    (the tiny model's bench/results_ref were measured so) and the random-weights fallback.
    """
    tdir, ddir = folder / "target", folder / "drafter"
    if not random_weights and (tdir / "config.json").is_file() and (ddir / "drafter_config.json").is_file():
        target = LlamaTarget.from_pretrained(tdir, dtype=torch.float32).use_packed_weights()
        drafter = Drafter.from_pretrained(ddir, dtype=drafter_dtype).use_packed_weights()
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
    """Held-out prompts of the small model (``tokenizers.Tokenizer``; random ids when None)."""
    if tok is None:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(0, vocab, (16 + 3 * i,), generator=g).tolist() for i in range(n)]  # sync-ok: host prompts
    return [tok.encode(p).ids for p in load_prompts(n, chars=chars, seed=0)]


class Text:
    """Text <-> ids for a loaded model: chat models wrap a prompt in their chat template."""

    def __init__(self, tok, kind: str, vocab: int) -> None:
        self.tok, self.kind, self.vocab = tok, kind, vocab  # kind: "chat", "hf", "tokenizers", "none"

    def encode(self, text: str) -> list[int]:
        if self.kind == "chat":
            return chat_prompt_ids(self.tok, text)
        if self.kind == "hf":
            return list(self.tok(text)["input_ids"])
        if self.kind == "tokenizers":
            return self.tok.encode(text).ids
        raise ValueError("this model has no tokenizer: --prompt needs one")

    def decode(self, ids: list[int]) -> str:
        if self.kind in ("chat", "hf"):
            return self.tok.decode(ids, skip_special_tokens=True)
        if self.kind == "tokenizers":
            return self.tok.decode(ids)
        return " ".join(map(str, ids))

    def heldout(self, n: int, chars: int = 200) -> list[tuple[str, list[int]]]:
        """``n`` held-out prompts never trained on: (text, ids)."""
        if self.kind == "chat":
            return [(p, self.encode(p)) for p in heldout_prompts(n)]
        if self.kind in ("tokenizers", "none"):
            ids = load_prompt_ids(self.tok, n, chars, self.vocab)
            return [(self.decode(p), p) for p in ids]
        return [(p, self.encode(p)) for p in load_prompts(n, chars=chars, seed=0)]


def load_named(model: str, drafter: str | None = None, drafter_dtype: torch.dtype | None = None,
               random_weights: bool = False):
    """``(target, drafter, Text, description)`` for ``--model`` (a name or a folder)."""
    if model == "tiny" or random_weights:
        target, d, tok, desc = load_models(CHECKPOINTS, random_weights, drafter_dtype)
        if drafter is not None:
            d = Drafter.from_pretrained(drafter, dtype=drafter_dtype).use_packed_weights()
        return target, d, Text(tok, "tokenizers" if tok is not None else "none", target.vocab_size), desc
    target, d, tok = load_model(model, drafter=drafter, drafter_dtype=drafter_dtype)
    kind = "none" if tok is None else ("chat" if getattr(tok, "chat_template", None) else "hf")
    return target, d, Text(tok, kind, target.vocab_size), f"{model} ({model_folder(model)})"


def n_params(m: torch.nn.Module) -> str:
    return f"{sum(p.numel() for p in m.parameters()) / 1e6:.1f}M"


def _short(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _int_or_auto(v: str) -> int | str:
    if v == "auto":
        return v
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {v!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'auto', got {v!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m redrafter_ext.demo", description=__doc__, formatter_class=_Formatter)
    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help="smollm2-135m-instruct, tiny, or a Hugging Face Llama folder")
    p.add_argument("--drafter", default=None, help="drafter folder (None: the one shipped for --model)")
    p.add_argument("--prompt", "-p", action="append", default=None,
                   help="answer this prompt (repeatable; None: the held-out prompts)")
    # default: the policy, which measures what pays on this machine and model (bench/batch.py, bench/e2e.py)
    p.add_argument("--beam-width", "-W", type=_int_or_auto, default="auto",
                   help="beams drafted per step, or auto (with -L auto: the speculation policy picks both)")
    p.add_argument("--beam-length", "-L", type=_int_or_auto, default="auto",
                   help="tokens per beam, the guaranteed one included, or auto")
    p.add_argument("--lookup", type=int, default=LOOKUP_DEFAULT,
                   help="the prompt-lookup beam's longest key (docs/lookup.md); 0: the drafter's beams only")
    p.add_argument("--batch-size", "-B", type=int, default=1, help="prompts decoded together")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt at most")
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts to decode")
    p.add_argument("--prompt-chars", type=int, default=200, help="tiny model: characters per held-out prompt")
    p.add_argument("--ops", choices=("native", "reference"), default="native",
                   help="the native kernels or the pure-PyTorch reference ops")
    p.add_argument("--random-weights", action="store_true", help="a small random model (no checkpoint needed)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0: the cores the load average leaves free)")
    p.add_argument("--drafter-dtype", choices=sorted(DTYPES) + ["auto"], default="auto",
                   help="drafter compute dtype; auto: the checkpoint's bf16 at batch 1, float32 (packed weights) above")
    p.add_argument("--show-chars", type=int, default=240, help="characters of each prompt and response shown")
    p.add_argument("--temperature", "-T", type=float, default=0.0, help="0: greedy; > 0: sampling")
    p.add_argument("--top-k", type=int, default=0, help="sampling: keep the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling: nucleus mass (1: all)")
    p.add_argument("--seed", type=int, default=0, help="sampling: seed of the uniforms")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    threads, warning = choose_threads(a.threads)
    torch.set_num_threads(threads)
    if warning:
        print(f"[demo] warning: {warning}", file=sys.stderr)
    ops = native_ops if a.ops == "native" else reference

    ddtype = auto_dtype(a.batch_size) if a.drafter_dtype == "auto" else DTYPES[a.drafter_dtype]
    try:
        target, drafter, text, desc = load_named(a.model, a.drafter, ddtype, a.random_weights)
    except (FileNotFoundError, ValueError, PermissionError) as e:
        print(f"[demo] error: {e}", file=sys.stderr)
        return 2
    eos = target.config.eos_token_id
    if a.prompt:
        try:
            items = [(t, text.encode(t)) for t in a.prompt]
        except ValueError as e:
            print(f"[demo] error: {e}", file=sys.stderr)
            return 2
    else:
        items = text.heldout(a.prompts, a.prompt_chars)
    W, L, B = a.beam_width, a.beam_length, a.batch_size
    try:  # one policy for every prompt, as an engine keeps one
        policy = policy_arg(W, L, None)
    except ValueError as e:
        print(f"[demo] error: -W/-L: {e}", file=sys.stderr)
        return 2
    if a.lookup < 0:
        print(f"[demo] error: --lookup must be >= 0, got {a.lookup}", file=sys.stderr)
        return 2
    N = menu_nodes_max(policy.menu) if policy else num_nodes_max(W, L)
    shape = (f"W=auto L=auto (speculation policy over {' '.join(f'{w}x{n}' for w, n in policy.menu)})" if policy
             else f"W={W} L={L}")
    print(f"target: {desc}, {n_params(target)} params ({target.embed_weight.dtype}); drafter: {n_params(drafter)} "
          f"params ({next(drafter.parameters()).dtype}); ops: {a.ops}; {load_and_threads()}")
    sampling = dict(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p)
    greedy = a.temperature == 0.0
    mode = "greedy" if greedy else f"sampling T={a.temperature} top-k={a.top_k} top-p={a.top_p} seed={a.seed}"
    print(f"{shape}{f' + lookup beam (keys <= {a.lookup})' if a.lookup else ''} (N={N} nodes max), batch {B}, "
          f"{len(items)} prompts, max {a.max_new_tokens} new tokens, {mode}")

    prompts = [ids for _, ids in items]
    # warm-up: first calls pay for allocation and kernel selection. Every shape of the menu warms
    # outside the policy: a cold first window it measured made drafting look dear and kept it plain
    autoregressive_generate(target, prompts[:1], 4, eos_id=eos, **sampling)
    for w, n in (policy.menu if policy else [(W, L)]):
        generate(target, drafter, prompts[:1], 4, beam_width=w, beam_length=n, eos_id=eos, ops=ops, lookup=a.lookup,
                 **sampling)

    t_ar = t_rd = 0.0
    n_ar = n_rd = steps = nodes = 0
    same = 0
    timer = StageTimer(target.embed_weight.device)
    for s in range(0, len(prompts), B):
        chunk = prompts[s : s + B]
        # AR and ReDrafter alternate chunk by chunk, so a change of load hits both alike
        t0 = time.perf_counter()
        ar = autoregressive_generate(target, chunk, a.max_new_tokens, eos_id=eos, seed=a.seed + s, **sampling)
        dt_ar = time.perf_counter() - t0
        ctimer = StageTimer(target.embed_weight.device)
        t0 = time.perf_counter()
        rd = generate(target, drafter, chunk, a.max_new_tokens, beam_width=W, beam_length=L, eos_id=eos, ops=ops,
                      timer=ctimer, seed=a.seed + s, policy=policy, lookup=a.lookup, **sampling)
        dt_rd = time.perf_counter() - t0
        for k, v in ctimer.seconds.items():
            timer.seconds[k] += v
        c_ar, c_rd, c_steps = sum(map(len, ar.tokens)), sum(map(len, rd.tokens)), sum(rd.steps)
        t_ar, t_rd, n_ar, n_rd, steps = t_ar + dt_ar, t_rd + dt_rd, n_ar + c_ar, n_rd + c_rd, steps + c_steps
        nodes += sum(rd.nodes)
        c_same = sum(x == y for x, y in zip(ar.tokens, rd.tokens))
        same += c_same
        split = ctimer.split()
        tot = sum(split.values()) or 1.0
        for j, out in enumerate(rd.tokens):
            print(f"\n[{s + j + 1}] prompt: {_short(items[s + j][0], a.show_chars)}")
            print(f"    response: {_short(text.decode(out), a.show_chars)}")
        print(f"    AR {c_ar / dt_ar:.1f} tok/s | ReDrafter {c_rd / dt_rd:.1f} tok/s | speedup "
              f"{(c_rd / dt_rd) / (c_ar / dt_ar):.2f}x | {c_rd / max(1, c_steps):.2f} tokens/step | "
              + ("identical to AR" if greedy and c_same == len(chunk) else "DIFFERS from AR" if greedy else "sampled")
              + " | " + ", ".join(f"{k} {100 * split[k] / tot:.0f}%" for k in STAGES))

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
    total = sum(split.values()) or 1.0
    print("\nReDrafter time per stage: " + ", ".join(
        f"{k} {1e3 * split[k] / max(1, steps / max(1, B)):.2f} ms/step ({100 * split[k] / total:.0f}%)" for k in STAGES))
    print(f"({load_and_threads()} at the end)")
    if greedy:
        print(f"\noutputs identical to greedy AR: {same}/{len(prompts)}")
    else:
        print("\nsampling: outputs are samples of the same distribution, not compared token for token")
    return 0 if not greedy or same == len(prompts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
