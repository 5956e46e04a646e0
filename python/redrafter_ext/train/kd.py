"""Long, resumable distillation of a drafter from teacher-forced shards (``teacher``).

    python -m redrafter_ext.train kd --run RUN --data SHARDS[:w],SHARDS2[:w] --max-steps 20000 --minutes 120
    python -m redrafter_ext.train kd --run RUN2 --init RUN --data SELFGEN_SHARDS:0.7,SHARDS:0.3 --max-steps 3000

A run folder holds ``checkpoint.pt`` (float32 weights, optimizer state, step, sampler state and the
history), written atomically every ``--save-every-minutes`` and at the end; started again with the
same ``--run`` the job continues the same run: same schedule, same step count, same loss curve
(``--minutes`` bounds one sitting, ``--max-steps`` the run). ``--init`` starts a new run (a fine-tune)
from another run's checkpoint or a drafter folder. Each save also writes the drafter (bf16) and its
``training_summary.json`` to ``--out`` (default ``RUN/drafter``), so a stopped job leaves a usable drafter.

Batches mix the ``--data`` groups by weight (``A+B:w``: the shards of A and B in proportion to their
positions); each folder is re-scanned every ``--refresh-every`` steps,
so training can follow a ``teacher`` job writing shards beside it.

Loss: top-k soft-label distillation. For a position t and look-ahead k = 1..K the drafter (from
``h_t`` and the embeddings of tokens t+1..t+k) is fitted to the target's distribution at t+k over the
head's tokens, sharpened by ``--teacher-temperature`` and cut to its ``--teacher-topk`` most likely
tokens (renormalised): cross-entropy ``-sum_i p_i log q_i`` over those k tokens only.

Held-out yardstick: the target's greedy answers to the hand-written held-out prompts (generated once
into ``RUN/heldout``): per-step top-1 agreement with the target's argmax over the whole vocabulary,
and the tokens per step a beam search of each ``--eval-shapes`` W x L would get accepted there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from ..drafter import Drafter, DrafterConfig
from .common import accepted_tokens, load_target, save_drafter, start_job, tied_embedding
from .teacher import Shards, parse_layers

__all__ = ["KDConfig", "kd_loss", "HeldOut", "heldout_set", "evaluate_drafters", "train_kd", "add_args",
           "config_from_args", "add_eval_args"]

# fields a resumed run must share with its checkpoint (the model's shape and the data's meaning)
_STRUCTURAL = ("target", "K", "num_layers", "draft_vocab", "feature_layers")


@dataclass
class KDConfig:
    target: str = "smollm2-135m-instruct"
    data: str = ""  # FOLDER[+FOLDER...][:weight],... teacher shard folders
    run: str = ""
    out: str | None = None  # default RUN/drafter
    init: str | None = None  # a run folder or a drafter folder to start from
    max_steps: int = 20000
    minutes: float | None = None  # this sitting (the run resumes where it stopped)
    stop_at: int | None = None  # end this sitting at this step (the run resumes where it stopped)
    batch_size: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 200
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    K: int = 5
    num_layers: int = 2
    draft_vocab: int = 8192
    vocab_positions: int = 100_000  # positions whose target argmax picks the head's tokens
    vocab_from: str | None = None  # the head's tokens from a drafter folder's vocab_map or a selfgen folder's answers
    teacher_temperature: float = 0.25
    teacher_topk: int = 50
    head_init: str = "random"  # random | embedding (the h half of the head from the target's embedding rows)
    feature_layers: str | None = None  # e.g. "10,20": condition on those decoder layers too (shards made with --layers)
    feature_noise: float = 0.0  # training only: Gaussian noise on the input features, std relative to each row's RMS
    bf16: bool = True
    threads: int | None = None
    seed: int = 0
    eval_every: int = 500
    eval_positions: int = 2048
    eval_shapes: str = "1x4,4x5"
    heldout: str | None = None  # a teacher shard folder as the yardstick (default: the hand-written prompts)
    save_every_minutes: float = 10.0
    refresh_every: int = 200


def kd_loss(drafter: Drafter, h: Tensor, emb: Tensor, th: Tensor, head: Tensor, temperature: float, topk: int):
    """Top-k soft cross-entropy of the drafter's K steps to the target's sharpened distributions.

    ``h (B, H)``, ``emb (B, K, H)``, ``th (B, K, H)`` (target hiddens at t+1..t+K), ``head (V_d, H)``.
    Returns ``(loss, agreement per step (K,))``: agreement of the drafter's argmax with the target's
    within the head's tokens."""
    logits = drafter.unroll(h, emb).float()  # [B, K, V_d]
    # the teacher in float32 even under autocast: sharpening magnifies bf16 rounding of its logits
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        t = (th.float() @ head.float().T) / temperature  # [B, K, V_d]
        if 0 < topk < t.shape[-1]:
            vals, idx = t.topk(topk, dim=-1)
            p = torch.softmax(vals, dim=-1)
            t_arg = idx[..., 0]
        else:
            p, idx = torch.softmax(t, dim=-1), None
            t_arg = t.argmax(-1)
    logz = torch.logsumexp(logits, dim=-1, keepdim=True)
    logq = (logits if idx is None else logits.gather(-1, idx)) - logz
    loss = -(p * logq).sum(-1).mean()
    agree = (logits.argmax(-1) == t_arg).float().mean(0).detach()
    return loss, agree


class _Mixture:
    """Weighted random windows from groups of shard folders (``A+B:w``: one group, its shards drawn in
    proportion to their positions); the sampler's state is checkpointed by the caller."""

    def __init__(self, spec: str, K: int, layers: list[int] = ()) -> None:
        self.sources: list[tuple[list[Shards], float]] = []
        self.layers = list(layers)
        for item in spec.split(","):
            if not item:
                continue
            paths, _, w = item.partition(":")
            group = []
            for path in paths.split("+"):
                if not Path(path).is_dir():
                    raise FileNotFoundError(f"kd --data: no folder {path} (make shards with `teacher --out {path}`)")
                group.append(Shards(path, K))
            self.sources.append((group, float(w) if w else 1.0))
        if not self.sources:
            raise ValueError("kd: --data names no shard folder")
        self.K = K
        self._check()

    def _check(self) -> None:
        for g, _ in self.sources:
            for s in g:
                for p in s.parts:
                    if self.layers and p.get("layers") != self.layers:
                        raise ValueError(f"kd --feature-layers {self.layers}: the shards of {s.folder} hold layers "
                                         f"{p.get('layers')} (make them with `teacher --layers "
                                         f"{','.join(map(str, self.layers))}`)")

    def refresh(self) -> int:
        n = sum(s.refresh() for g, _ in self.sources for s in g)
        self._check()
        return n

    def describe(self) -> str:
        return "; ".join(" + ".join(f"{s.folder.name}: {len(s.parts)} shards, {s.positions:,} positions" for s in g)
                         + f" (w {w:g})" for g, w in self.sources)

    def sample(self, n: int, gen: torch.Generator, embed: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``(h (n, F), emb (n, K, H), th (n, K, H))`` float32 of n random windows: h the features at t
        (F = H, or H + the extra layers' outputs), th the final-norm states at t+1..t+K."""
        live = [([p for s in g for p in s.parts if len(p["starts"])], w) for g, w in self.sources]
        live = [(parts, w) for parts, w in live if parts]
        if not live:
            raise RuntimeError("kd: the data folders hold no shards yet")
        tot = sum(w for _, w in live)
        counts = [int(n * w / tot) for _, w in live]
        counts[0] += n - sum(counts)
        hs, es, ths = [], [], []
        K = self.K
        for (parts, _), c in zip(live, counts):
            if c == 0:
                continue
            sizes = torch.tensor([len(p["starts"]) for p in parts], dtype=torch.float)
            which = torch.multinomial(sizes, c, replacement=True, generator=gen)
            for pi in which.unique().tolist():
                part = parts[pi]
                m = int((which == pi).sum())
                st = part["starts"][torch.randint(len(part["starts"]), (m,), generator=gen)]
                idx = st[:, None] + torch.arange(K + 1)[None, :]
                rows = part["hidden"][idx].float()  # [m, K+1, H]
                hs.append(torch.cat([rows[:, 0], part["extra"][st].float()], -1) if self.layers else rows[:, 0])
                ths.append(rows[:, 1:])
                es.append(F.embedding(part["tokens"][idx[:, :K]].long(), embed))
        return torch.cat(hs), torch.cat(es), torch.cat(ths)

    def argmax_counts(self, n: int, gen: torch.Generator, embed: Tensor) -> Tensor:
        """How often each token is the target's argmax at ``n`` random data positions."""
        counts = torch.zeros(embed.shape[0], dtype=torch.long)
        for i in range(0, n, 4096):
            h, _, _ = self.sample(min(4096, n - i), gen, embed)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                counts += torch.bincount((h[:, : embed.shape[1]] @ embed.T).argmax(-1), minlength=embed.shape[0])
        return counts


class HeldOut:
    """The held-out yardstick: windows of the target's greedy answers, the target's argmax cached.

    ``hidden (T, H)`` final-norm states; ``extra (T, nH)`` the feature layers' outputs, or None."""

    def __init__(self, tokens: Tensor, hidden: Tensor, starts: Tensor, K: int, embed: Tensor, positions: int,
                 extra: Tensor | None = None) -> None:
        g = torch.Generator().manual_seed(1234)
        sel = starts[torch.randperm(len(starts), generator=g)[:positions]]
        idx = sel[:, None] + torch.arange(K + 1)[None, :]
        rows = hidden[idx].float()
        self.h, self.tok0 = rows[:, 0], tokens[sel].long()
        self.extra = None if extra is None else extra[sel].float()
        self.emb = F.embedding(tokens[idx[:, :K]].long(), embed)
        self.truth = torch.cat([(rows[i : i + 512, 1:] @ embed.T).argmax(-1) for i in range(0, len(sel), 512)])
        self.answer = tokens[idx].long()  # tokens t+1 .. t+K+1 of the greedy answer
        self.all_tokens = tokens

    @torch.no_grad()
    def evaluate(self, drafter: Drafter, embed: Tensor, shapes: list[tuple[int, int]], batch: int = 256) -> dict:
        from .. import ops

        was = drafter.training
        drafter.eval()
        K = self.emb.shape[1]
        want = drafter.config.feature_size - drafter.config.hidden_size
        have = 0 if self.extra is None else self.extra.shape[1]
        if want and have != want:
            raise ValueError(f"HeldOut: the drafter reads layers {drafter.config.feature_layers}, this yardstick "
                             f"holds {have // drafter.config.hidden_size} extra layers")
        feats = torch.cat([self.h, self.extra], -1) if want else self.h
        agree = torch.zeros(K)
        vmap = drafter.vocab_map
        for i in range(0, len(self.h), batch):
            logits = drafter.unroll(feats[i : i + batch].to(drafter.lm_head.weight.dtype),
                                    self.emb[i : i + batch].to(drafter.lm_head.weight.dtype)).float()
            pred = logits.argmax(-1) if vmap is None else vmap[logits.argmax(-1)]
            agree += (pred == self.truth[i : i + batch]).float().sum(0)
        res = {"positions": len(self.h), "agreement_per_step": (agree / len(self.h)).tolist()}
        for W, L in shapes:
            acc = []
            for i in range(0, len(self.h), batch):
                b = drafter.beam_search(feats[i : i + batch], self.tok0[i : i + batch], embed, W, L, ops)
                acc.append(accepted_tokens(b[:, :, 1:], self.answer[i : i + batch, 1:L]))
            res[f"tokens_per_step_{W}x{L}"] = torch.cat(acc).mean().item()
        drafter.train(was)
        return res


def heldout_set(folder: str | Path, K: int, embed: Tensor, positions: int, *, shards: bool,
                target: str = "smollm2-135m-instruct", threads: int | None = None, layers: list[int] = (),
                model=None) -> HeldOut:
    """The yardstick in ``folder``: teacher shards (``shards``), or the greedy answers to the
    hand-written held-out prompts (``chat_data`` records, generated there once when missing).
    ``layers``: the feature layers' outputs too (from the shards, or for the hand-written answers
    by one float32 forward of ``model``, the target, over each prompt and answer)."""
    from .chat_data import ChatDataConfig, generate_chat_data, load_chat_data
    from .distill_chat import flatten
    from .teacher import features

    layers = list(layers)
    if shards:
        s = Shards(folder, K)
        if not s.parts:
            raise FileNotFoundError(f"kd: no shard-*.pt in {folder}")
        if layers and any(x.get("layers") != layers for x in s.parts):
            raise ValueError(f"kd: the held-out shards in {folder} do not hold layers {layers}")
        offs = [sum(len(y["tokens"]) for y in s.parts[:i]) for i in range(len(s.parts))]
        return HeldOut(torch.cat([x["tokens"] for x in s.parts]), torch.cat([x["hidden"] for x in s.parts]),
                       torch.cat([x["starts"] + o for x, o in zip(s.parts, offs)]), K, embed, positions,
                       torch.cat([x["extra"] for x in s.parts]) if layers else None)
    if not list(Path(folder).glob("part-*.pt")):
        generate_chat_data(ChatDataConfig(target=target, out=str(folder), passes="0", split="heldout", seed=0,
                                          threads=threads))
    recs = load_chat_data(folder)
    tokens, hidden, starts = flatten(recs, K)
    extra = None
    if layers:
        if model is None:
            raise ValueError("heldout_set: layers need the target model")
        ex = []
        for r in recs:  # the records flatten keeps, in its order
            P = r["prompt_len"]
            R = min(len(r["tokens"]) - P, r["hidden"].shape[0])
            if R > K:
                _, x = features(model, [r["tokens"].tolist()], torch.float32, layers)
                ex.append(x[0, P - 1 : P - 1 + R].to(torch.float16))
        extra = torch.cat(ex)
    return HeldOut(tokens, hidden, starts, K, embed, positions, extra)


def _heldout(run: Path, cfg: KDConfig, embed: Tensor, model=None) -> HeldOut:
    layers = parse_layers(cfg.feature_layers)
    if cfg.heldout:
        return heldout_set(cfg.heldout, cfg.K, embed, cfg.eval_positions, shards=True, layers=layers)
    return heldout_set(run / "heldout", cfg.K, embed, cfg.eval_positions, shards=False, target=cfg.target,
                       threads=cfg.threads, layers=layers, model=model)


def evaluate_drafters(drafters: list[str], target: str, heldout: list[str], K: int = 5, positions: int = 2048,
                      shapes: str = "1x3,1x4,1x5,2x5,4x5", cache: str | None = None) -> dict:
    """Each drafter folder on each yardstick: ``hand`` (greedy answers to the hand-written held-out
    prompts, cached in ``cache``) and shard folders; returns ``{yardstick: {drafter: results}}``."""
    from ..hub import cache_dir

    model, _, _ = load_target(target)
    embed = model.get_input_embeddings().weight.detach().float()
    # one yardstick per set of feature layers the drafters read (the positions are the same)
    cfgs = {d: DrafterConfig.load(Path(d) / "drafter_config.json") for d in drafters}
    res: dict = {}
    for name in heldout:
        res[name] = {}
        sets: dict = {}
        for d in drafters:
            layers = tuple(cfgs[d].feature_layers or ())
            if layers not in sets:
                if name == "hand":
                    sets[layers] = heldout_set(Path(cache) if cache else cache_dir() / "heldout" / Path(target).name,
                                               K, embed, positions, shards=False, target=target, layers=layers,
                                               model=model)
                else:
                    sets[layers] = heldout_set(name, K, embed, positions, shards=True, layers=layers)
            ho = sets[layers]
            r = ho.evaluate(Drafter.from_pretrained(d, dtype=torch.float32), embed, _shapes(shapes))
            res[name][d] = r
            print(f"[evaluate] {name} | {d}: agreement " + " ".join(f"{x:.3f}" for x in r["agreement_per_step"])
                  + " | tokens/step " + " ".join(f"{k.removeprefix('tokens_per_step_')} {v:.2f}" for k, v in r.items()
                                                 if k.startswith("tokens_per_step")), flush=True)
    return res


def _noisy(h: Tensor, scale: float, seed: int, step: int) -> Tensor:
    """``h (B, F)`` plus Gaussian noise of std ``scale`` x each row's RMS (EAGLE's feature noise: the
    drafter meets the target's states, not the training set's). Its own generator, seeded by the step:
    the batches stay those of a run without noise (paired ablations) and a resumed run draws the same."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    rms = h.pow(2).mean(-1, keepdim=True).sqrt()
    return h + scale * rms * torch.randn(h.shape, generator=g, dtype=h.dtype)


def _save_atomic(obj, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _shapes(spec: str) -> list[tuple[int, int]]:
    out = []
    for s in spec.split(","):
        w, _, l = s.partition("x")
        if not (w.isdigit() and l.isdigit()) or int(w) < 1 or int(l) < 2:
            raise ValueError(f"kd --eval-shapes: {s!r} is not WxL with W >= 1, L >= 2")
        out.append((int(w), int(l)))
    return out


def _lr(cfg: KDConfig, step: int) -> float:
    """Linear warm-up, then cosine to ``lr * min_lr_ratio`` at ``max_steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def _head_tokens(cfg: KDConfig, data: _Mixture, gen: torch.Generator, embed: Tensor, eos: int | None, n: int) -> Tensor:
    """The head's ``n`` token ids: the most frequent target argmax over ``cfg.vocab_positions`` data
    positions, or the answers of a selfgen folder, or a drafter's own (``cfg.vocab_from``)."""
    src = Path(cfg.vocab_from) if cfg.vocab_from else None
    if src is not None and (src / "drafter_config.json").is_file():
        ids = Drafter.from_pretrained(src).vocab_map
        if ids is None or len(ids) != n:
            raise ValueError(f"kd --vocab-from {src}: its head covers {None if ids is None else len(ids)} tokens, "
                             f"this run's {n}")
        return ids.clone()
    if src is not None:
        import numpy as np

        parts = sorted(src.glob("part-*.npz"))
        if not parts:
            raise FileNotFoundError(f"kd --vocab-from {src}: neither a drafter folder nor a selfgen folder")
        toks = torch.from_numpy(np.concatenate([np.load(p)["answer"] for p in parts]).astype(np.int64))
        counts = torch.bincount(toks, minlength=embed.shape[0]).double()
    else:
        counts = data.argmax_counts(cfg.vocab_positions, gen, embed).double()
    if eos is not None:
        counts[int(eos)] = float("inf")  # the end of an answer is always draftable
    return torch.sort(-counts, stable=True).indices[:n]  # stable: ties by id


def _lineage(init: str | None) -> dict | None:
    """What a fine-tune started from: the recipe of ``init`` (its summary without the history)."""
    if not init:
        return None
    p = Path(init)
    f = p / "training_summary.json" if (p / "training_summary.json").is_file() else p / "drafter" / "training_summary.json"
    if not f.is_file():
        return {"from": str(init)}
    d = json.loads(f.read_text())
    return {"from": str(init), **{k: v for k, v in d.items() if k != "history"}}


def _init_from(path: str, dcfg: DrafterConfig) -> Drafter:
    """The drafter at ``path`` as this run's start; one that reads only the final-norm state may start
    a run with ``feature_layers``: its weights carry over and the fusion starts as the identity."""
    p = Path(path)
    if (p / "checkpoint.pt").is_file():
        ck = torch.load(p / "checkpoint.pt", weights_only=False)
        d = Drafter(DrafterConfig(**ck["drafter_config"]))
        d.load_state_dict(ck["model"])
    else:
        d = Drafter.from_pretrained(p, dtype=torch.float32)
    if dcfg.feature_layers and not d.config.feature_layers and asdict(d.config) == {**asdict(dcfg), "feature_layers": None}:
        new = Drafter(dcfg)
        missing, unexpected = new.load_state_dict(d.float().state_dict(), strict=False)
        assert missing == ["fuse.weight"] and not unexpected, (missing, unexpected)
        d = new
    if asdict(d.config) != asdict(dcfg):
        raise ValueError(f"kd --init {path}: drafter {asdict(d.config)} does not match this run's {asdict(dcfg)}")
    return d.float().train()


def train_kd(cfg: KDConfig) -> dict:
    if not cfg.run:
        raise ValueError("kd: --run is required")
    if not cfg.feature_noise >= 0:
        raise ValueError(f"kd --feature-noise: must be >= 0, got {cfg.feature_noise!r}")
    if cfg.head_init not in ("random", "embedding"):
        raise ValueError(f"kd --head-init: random or embedding, got {cfg.head_init!r}")
    shapes = _shapes(cfg.eval_shapes)
    if any(L - 1 > cfg.K for _, L in shapes):
        raise ValueError(f"kd --eval-shapes: L - 1 must be <= K = {cfg.K}")
    start_job(cfg.threads)
    run = Path(cfg.run)
    run.mkdir(parents=True, exist_ok=True)
    out = Path(cfg.out) if cfg.out else run / "drafter"
    ck_path = run / "checkpoint.pt"
    ck = torch.load(ck_path, weights_only=False) if ck_path.is_file() else None
    if ck is not None:
        old = ck["config"]
        bad = [k for k in _STRUCTURAL if old.get(k) != getattr(cfg, k)]
        if bad:
            raise ValueError(f"kd: {ck_path} was trained with " + ", ".join(f"{k}={old.get(k)!r}" for k in bad)
                             + "; resume with the same values or start another --run")
    model, _, folder = load_target(cfg.target)
    embed, eos = tied_embedding(model, "kd")
    H, V = model.config.hidden_size, model.config.vocab_size
    layers = parse_layers(cfg.feature_layers, model.config.num_hidden_layers)
    data = _Mixture(cfg.data, cfg.K, layers)
    heldout = _heldout(run, cfg, embed, model)
    del model
    gen = torch.Generator().manual_seed(cfg.seed)
    dcfg = DrafterConfig(hidden_size=H, vocab_size=V, num_layers=cfg.num_layers,
                         draft_vocab_size=cfg.draft_vocab if 0 < cfg.draft_vocab < V else None,
                         feature_layers=layers or None)
    if ck is not None:
        drafter = Drafter(DrafterConfig(**ck["drafter_config"]))
        drafter.load_state_dict(ck["model"])
        gen.set_state(ck["gen"])
        step, history, seen = ck["step"], ck["history"], ck["positions_seen"]
        tqdm.write(f"[kd] resuming {ck_path} at step {step} of {cfg.max_steps}")
    else:
        torch.manual_seed(cfg.seed)
        if cfg.init:
            drafter = _init_from(cfg.init, dcfg)
        else:
            drafter = Drafter(dcfg)
            if drafter.vocab_map is not None:
                drafter.set_vocab_map(_head_tokens(cfg, data, gen, embed, eos, dcfg.draft_vocab_size))
            if cfg.head_init == "embedding":
                with torch.no_grad():
                    ids = drafter.vocab_map if drafter.vocab_map is not None else torch.arange(V)
                    drafter.lm_head.weight[:, :H] = embed[ids]
        step, history, seen = 0, [], 0
    drafter.float().train()
    ids = drafter.vocab_map if drafter.vocab_map is not None else torch.arange(V)
    head = embed[ids]
    oov = 1 - torch.isin(heldout.all_tokens.long(), ids).float().mean().item()
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    if ck is not None:
        opt.load_state_dict(ck["opt"])
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"[kd] target {folder}; drafter {n_params:,} parameters, head over {len(ids)} tokens (held-out answer "
          f"tokens outside it: {100 * oov:.2f}%); data: {data.describe()}", flush=True)

    lineage = _lineage(cfg.init)

    def summary(final: dict | None = None) -> dict:
        return {"target": cfg.target, "parameters": n_params, "hidden_size": H, "vocab_size": V,
                "draft_vocab_size": dcfg.draft_vocab_size, "num_layers": cfg.num_layers, "K": cfg.K,
                "steps": step, "positions_seen": seen, "heldout_oov_rate": oov, "data": data.describe(),
                "config": asdict(cfg), "history": history, **({"eval": final} if final else {}),
                **({"init": lineage} if lineage else {})}

    def save(final: dict | None = None) -> None:
        _save_atomic({"model": drafter.state_dict(), "opt": opt.state_dict(), "step": step, "gen": gen.get_state(),
                      "history": history, "positions_seen": seen, "config": asdict(cfg),
                      "drafter_config": asdict(drafter.config)}, ck_path)
        save_drafter(drafter, out, summary(final))

    t0 = last_save = time.time()
    bar = tqdm(total=cfg.max_steps, initial=step, desc="kd", unit="step", dynamic_ncols=True)
    ema = None
    try:
        while step < cfg.max_steps:
            if cfg.minutes is not None and time.time() - t0 > cfg.minutes * 60:
                tqdm.write(f"[kd] --minutes {cfg.minutes:g} used up at step {step}: resume with the same --run")
                break
            if cfg.stop_at is not None and step >= cfg.stop_at:
                break
            if step % cfg.refresh_every == 0 and data.refresh():
                tqdm.write(f"[kd] step {step}: data {data.describe()}")
            lr = _lr(cfg, step)
            for g in opt.param_groups:
                g["lr"] = lr
            h, emb, th = data.sample(cfg.batch_size, gen, embed)
            if cfg.feature_noise > 0:
                h = _noisy(h, cfg.feature_noise, cfg.seed, step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                loss, agree = kd_loss(drafter, h, emb, th, head, cfg.teacher_temperature, cfg.teacher_topk)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(drafter.parameters(), cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            seen += cfg.batch_size
            ema = agree if ema is None else 0.98 * ema + 0.02 * agree
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}", a1=f"{ema[0]:.3f}", aK=f"{ema[-1]:.3f}", lr=f"{lr:.1e}")
            if step % cfg.eval_every == 0 or step == cfg.max_steps:
                r = heldout.evaluate(drafter, embed, shapes)
                r.update(step=step, loss=loss.item(), train_agreement=ema.tolist(), load=os.getloadavg()[0],
                         minutes=(time.time() - t0) / 60)
                history.append(r)
                tqdm.write(f"[kd] step {step}: held-out agreement " + " ".join(f"{x:.3f}" for x in r["agreement_per_step"])
                           + "; tokens/step " + " ".join(f"{W}x{L} {r[f'tokens_per_step_{W}x{L}']:.2f}" for W, L in shapes)
                           + f" (load {r['load']:.1f})")
            if time.time() - last_save > cfg.save_every_minutes * 60:
                save()
                last_save = time.time()
    finally:
        bar.close()
    final = None
    if step >= cfg.max_steps:
        more = {(1, 4), (1, 5), (2, 5), (4, 5)}
        final = heldout.evaluate(drafter, embed, sorted(set(shapes) | {s for s in more if s[1] - 1 <= cfg.K}))
        tqdm.write("[kd] final: " + json.dumps(final))
    save(final)
    print(f"[kd] {ck_path} at step {step} of {cfg.max_steps}; drafter in {out}", flush=True)
    return summary(final)


_HELP = {
    "data": "teacher shard folders FOLDER[+FOLDER...][:weight],...: each group drawn by weight, its folders' shards "
            "in proportion to their positions (re-scanned as a teacher job writes them)",
    "run": "run folder: checkpoint.pt, heldout/ (resumable: rerun with the same --run)",
    "out": "drafter folder written at each save (default RUN/drafter)",
    "init": "start a new run from a run folder's checkpoint or a drafter folder (fine-tuning)",
    "minutes": "stop this sitting after this long (the run resumes where it stopped)",
    "max_steps": "the run's length (the learning-rate schedule's)",
    "teacher_topk": "soft labels: the target's k most likely head tokens, renormalised (0: all)",
    "head_init": "random, or embedding: the head's h half from the target's embedding rows",
    "eval_shapes": "beam shapes WxL whose held-out tokens/step are printed",
    "stop_at": "end this sitting at this step (the run resumes where it stopped)",
    "vocab_from": "the head's tokens: a drafter folder's (its vocab_map) or the commonest answer tokens of a selfgen "
                  "folder (default: the commonest target argmax over --vocab-positions data positions)",
    "heldout": "a teacher shard folder as the held-out yardstick (default: greedy answers to the hand-written prompts)",
    "feature_noise": "training only: add Gaussian noise of this std, relative to each row's RMS, to the drafter's input "
                     "features (EAGLE's feature noise, against memorising the training set; 0: none)",
    "feature_layers": "condition on these target decoder layers' outputs too, e.g. 10,20 (EAGLE-3's fusion; the shards "
                      "must be made with `teacher --layers` of the same list; --init may name a drafter without them)",
}


def add_args(p: argparse.ArgumentParser) -> None:
    d = KDConfig()
    for name, f in KDConfig.__dataclass_fields__.items():
        flag, default = "--" + name.replace("_", "-"), getattr(d, name)
        if isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=_HELP.get(name))
            continue
        typ = {"int": int, "float": float, "str": str}[str(f.type).replace(" | None", "")]
        p.add_argument(flag, type=typ, default=default, required=name in ("run", "data"), help=_HELP.get(name))


def config_from_args(a: argparse.Namespace) -> KDConfig:
    from .common import dataclass_from_args

    return dataclass_from_args(KDConfig, a)


def add_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", action="append", required=True, help="drafter folder (repeatable)")
    p.add_argument("--target", default="smollm2-135m-instruct")
    p.add_argument("--heldout", action="append", default=None,
                   help="yardstick: 'hand' (greedy answers to the hand-written held-out prompts) or a teacher shard "
                   "folder (repeatable; default: hand)")
    p.add_argument("--K", type=int, default=5)
    p.add_argument("--positions", type=int, default=2048)
    p.add_argument("--shapes", default="1x3,1x4,1x5,2x5,4x5")
    p.add_argument("--cache", default=None, help="folder of the hand-written prompts' answers (default: the user cache)")
    p.add_argument("--json", default=None, help="write the results here")
