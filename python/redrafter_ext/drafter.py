"""The ReDrafter drafter: an RNN over the target's own embeddings, conditioned on its hidden state.

    s_t = SiLU(W e_t + U s_{t-1} + b),  s_0 = 0          e_t: target input embedding of token t
    x   = concat(h, s_t);  x = x + SiLU(Linear(x))  (num_layers times)
    logits = Linear(2H, V_d)(x)

With ``feature_layers`` (e.g. [10, 20]) the target also hands over those decoder layers' outputs,
and h is fused from all of them once per draft: ``h = Linear((1+n)H, H)(concat(h_final,
rms(h_10), rms(h_20)))`` (EAGLE-3 fuses low, middle and high layers the same way); ``features``
below is then ``(..., (1+n)H)``, the final-norm state first.

Beam search runs L-1 such steps for W beams, each followed by the fused ``beam_topk`` op.

The head may cover only a subset of the target's vocabulary (``draft_vocab_size`` V_d < V, e.g. the
8192 tokens the target emits most): ``vocab_map (V_d,)`` maps a draft index to its real token id.
Beams hold draft indices while searching and real ids when returned, so verification is unchanged
(a token outside the subset is never drafted, only accepted as the target's own next token).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .few_rows import linear, pack_weights

__all__ = ["DrafterConfig", "Drafter", "beam_search", "auto_dtype"]

CONFIG_NAME = "drafter_config.json"
WEIGHTS_NAME = "drafter.safetensors"

# step_fn(prev_tokens [B, W] i32, state [B, W, D]) -> (logits [B, W, V], new_state [B, W, D])
StepFn = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


@dataclass
class DrafterConfig:
    hidden_size: int  # H: the target's hidden size (= its embedding size)
    vocab_size: int  # V: the target's vocabulary
    num_layers: int = 2  # residual blocks on concat(h, s)
    draft_vocab_size: int | None = None  # V_d: tokens the head scores (None: all V, no vocab_map)
    feature_layers: list[int] | None = None  # target decoder layers (1-based) fused with its final-norm state

    @property
    def feature_size(self) -> int:
        """Width of the conditioning the target hands over: H, or (1 + len(feature_layers)) * H."""
        return self.hidden_size * (1 + len(self.feature_layers or ()))

    @property
    def head_size(self) -> int:
        return self.vocab_size if self.draft_vocab_size is None else self.draft_vocab_size

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> DrafterConfig:
        return cls(**json.loads(Path(path).read_text()))


def beam_search(
    step_fn: StepFn, state0: Tensor, token: Tensor, beam_width: int, beam_length: int, ops: ModuleType
) -> Tensor:
    """Beam search over any step function, with the fused ``beam_topk`` op of ``ops``.

    Args:
        step_fn: ``(prev_tokens (B, w) i32, state (B, w, D)) -> (logits (B, w, V), state)``, called
            with w = 1 at the first step (only beam 0 is live) and w = W after.
        state0: ``(B, W, D)`` initial state, equal across beams.
        token: ``(B,)`` int, the guaranteed token (position 0 of every beam).
        ops: ``redrafter_ext.ops`` (native) or ``redrafter_ext.reference``.

    Returns:
        ``beams (B, W, L)`` int32, sorted by joint log-probability (ties to the lower index).
    """
    B = token.shape[0]
    W, L = beam_width, beam_length
    dev = token.device
    tokens = torch.zeros(B, W, L, dtype=torch.int32, device=dev)
    tokens[:, :, 0] = token.to(torch.int32)[:, None]
    # only beam 0 is live at the first step, so the first expansion has no duplicate beams
    scores = torch.full((B, W), float("-inf"), device=dev)
    scores[:, 0] = 0.0
    state = state0
    for step in range(1, L):
        if step == 1:
            # only beam 0 is live (the others score -inf whatever their logits), so run the first
            # step on one beam and broadcast: saves (W-1)/W of its cost
            logits, state = step_fn(tokens[:, :1, 0], state[:, :1])
            logits = logits.expand(B, W, logits.shape[2])
            state = state.expand(B, W, state.shape[2]).contiguous()
        else:
            logits, state = step_fn(tokens[:, :, step - 1], state)
        scores, tokens, state, _ = ops.beam_topk(logits, scores, tokens, state, step)
    return tokens


def auto_dtype(batch: int = 1, device: str | torch.device = "cpu") -> torch.dtype | None:
    """The drafter's compute dtype for ``batch`` rows: None (the checkpoint's, bf16) off the CPU.

    On the CPU bf16 at batch 1, float32 (over packed weights, ``use_packed_weights``) above. At
    one row the 8192-row head is a GEMV bound by its bytes: bf16 ran W=1 ReDrafter 1.08x faster
    than packed float32, even on an AVX2 EPYC (Zen 3) with no native bf16. At more rows compute
    dominates: bf16 ~4x slower at 32 rows; packed float32 1.14x faster than bf16 at B=1 W=2.
    """
    if torch.device(device).type != "cpu":
        return None
    return torch.bfloat16 if batch == 1 else torch.float32


class Drafter(nn.Module):
    """ReDrafter drafter. Parameters: ``rnn_w`` (H->H), ``rnn_u`` (H->H, with bias ``b``),
    ``blocks`` (num_layers x Linear(2H, 2H)), ``lm_head`` (Linear(2H, V_d)); with a reduced head,
    the buffer ``vocab_map (V_d,)`` int64 of real token ids (distinct, in ``[0, V)``)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        H = config.hidden_size
        self.rnn_w = nn.Linear(H, H, bias=False)
        self.rnn_u = nn.Linear(H, H, bias=True)
        self.blocks = nn.ModuleList(nn.Linear(2 * H, 2 * H) for _ in range(config.num_layers))
        self.lm_head = nn.Linear(2 * H, config.head_size, bias=False)
        # fuses the final-norm state with other layers' outputs; starts as "the final-norm state only"
        self.fuse = nn.Linear(config.feature_size, H, bias=False) if config.feature_layers else None
        if self.fuse is not None:
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, :H] = torch.eye(H)
        self.vocab_map: Tensor | None
        if config.draft_vocab_size is not None:
            if not 0 < config.draft_vocab_size <= config.vocab_size:
                raise ValueError(f"DrafterConfig: draft_vocab_size={config.draft_vocab_size} must be in "
                                 f"[1, vocab_size={config.vocab_size}]")
            self.register_buffer("vocab_map", torch.arange(config.draft_vocab_size, dtype=torch.int64))
        else:
            self.vocab_map = None

    def set_vocab_map(self, ids: Tensor) -> None:
        """Set the real token ids ``ids (V_d,)`` of the head's rows (distinct, in ``[0, V)``)."""
        if self.vocab_map is None:
            raise ValueError("set_vocab_map: this drafter's head covers the whole vocabulary")
        ids = torch.as_tensor(ids, dtype=torch.int64).reshape(-1)
        V = self.config.vocab_size
        if ids.numel() != self.vocab_map.numel():
            raise ValueError(f"set_vocab_map: expected {self.vocab_map.numel()} ids, got {ids.numel()}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V or ids.unique().numel() != ids.numel()):
            raise ValueError(f"set_vocab_map: ids must be distinct and in [0, {V})")
        self.vocab_map.copy_(ids)

    def use_packed_weights(self, enabled: bool = True) -> Drafter:
        """Keep packed copies of every weight for beam steps of few rows (float32, CPU;
        ``few_rows.pack_weights``): B*W rows against the 8192 x 1152 head cost about half of
        MKL's GEMM at 4 rows. Call again after ``.to()`` or training to refresh."""
        pack_weights([self.rnn_w, self.rnn_u, *self.blocks, self.lm_head, *([self.fuse] if self.fuse else [])], enabled)
        return self

    def to_auto_dtype(self, batch: int) -> Drafter:
        """Move to ``auto_dtype(batch)`` (kept where it says None) and pack float32 weights: bf16
        <-> float32 round trips of a bf16 checkpoint are exact, so one load serves every batch."""
        dtype = auto_dtype(batch, self.lm_head.weight.device)
        return (self.to(dtype) if dtype is not None else self).use_packed_weights()

    def to_real_ids(self, draft_ids: Tensor) -> Tensor:
        """Map draft indices (any shape) to real token ids (identity for a full-vocabulary head)."""
        if self.vocab_map is None:
            return draft_ids
        return self.vocab_map.to(draft_ids.device)[draft_ids.to(torch.int64)].to(draft_ids.dtype)

    def condition(self, features: Tensor) -> Tensor:
        """``features (..., feature_size)`` -> the drafter's conditioning ``(..., H)``: the final-norm
        state itself, or its fusion with the other layers' outputs, each RMS-normalised first (the
        residual stream's scale grows with depth and varies by token)."""
        if self.fuse is None:
            return features
        H = self.config.hidden_size
        if features.shape[-1] != self.config.feature_size:
            raise ValueError(f"Drafter: features of width {features.shape[-1]}, expected {self.config.feature_size} "
                             f"(the final-norm state and layers {self.config.feature_layers})")
        x = features[..., H:].unflatten(-1, (-1, H))
        x = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)
        return linear(torch.cat([features[..., :H], x.flatten(-2)], dim=-1), self.fuse)

    def rnn_step(self, emb: Tensor, state: Tensor) -> Tensor:
        """``emb (..., H)`` embedding of the previous token, ``state (..., H)`` -> new state."""
        return F.silu(linear(emb, self.rnn_w) + linear(state, self.rnn_u))

    def logits(self, hidden: Tensor, state: Tensor) -> Tensor:
        """``hidden (..., H)`` target hidden, ``state (..., H)`` -> logits ``(..., V)``."""
        x = torch.cat([hidden.expand_as(state), state], dim=-1)
        for block in self.blocks:
            x = x + F.silu(linear(x, block))
        return linear(x, self.lm_head)

    def unroll(self, hidden: Tensor, embeds: Tensor) -> Tensor:
        """Teacher-forced unroll for training.

        Args:
            hidden: ``(..., feature_size)`` target features at position t (they predicted token t+1).
            embeds: ``(..., K, H)`` target embeddings of tokens t+1..t+K.

        Returns:
            logits ``(..., K, V)``: step k predicts token t+k+1.
        """
        hidden = self.condition(hidden)
        state = torch.zeros_like(embeds[..., 0, :])
        out = []
        for k in range(embeds.shape[-2]):
            state = self.rnn_step(embeds[..., k, :], state)
            out.append(self.logits(hidden, state))
        return torch.stack(out, dim=-2)

    @torch.no_grad()
    def beam_search(
        self,
        hidden: Tensor,
        token: Tensor,
        embed_weight: Tensor,
        beam_width: int,
        beam_length: int,
        ops: ModuleType,
    ) -> Tensor:
        """Draft W beams of L tokens from the target's last hidden state.

        Args:
            hidden: ``(B, feature_size)`` target features at the last committed token: its hidden
                state after the final norm (and ``feature_layers``' outputs after it).
            token: ``(B,)`` int, the guaranteed next token.
            embed_weight: ``(V, H)`` the target's input embedding table.

        Returns:
            ``beams (B, W, L)`` int32, ``beams[:, :, 0] == token``.
        """
        B = hidden.shape[0]
        H = self.config.hidden_size
        dtype = self.lm_head.weight.dtype
        h = self.condition(hidden.to(dtype))[:, None, :]  # [B, 1, H]

        vmap = self.vocab_map
        calls = [0]

        def step(prev: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
            ids = prev.to(torch.int64)
            if vmap is not None and calls[0] > 0:  # beams hold draft indices after the first step
                ids = vmap[ids]
            calls[0] += 1
            emb = F.embedding(ids, embed_weight).to(dtype)
            state = self.rnn_step(emb, state)
            return self.logits(h, state), state

        state0 = torch.zeros(B, beam_width, H, dtype=dtype, device=hidden.device)
        beams = beam_search(step, state0, token, beam_width, beam_length, ops)
        if vmap is None:
            return beams
        return torch.cat([beams[:, :, :1], vmap[beams[:, :, 1:].to(torch.int64)].to(torch.int32)], dim=2)

    def save_pretrained(self, folder: str | Path) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.config.save(folder / CONFIG_NAME)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(folder / WEIGHTS_NAME))

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"
    ) -> Drafter:
        """Load ``drafter_config.json`` + ``drafter.safetensors`` (dtype: the checkpoint's by default)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg_path = folder / CONFIG_NAME
        if not cfg_path.is_file():
            raise FileNotFoundError(f"Drafter.from_pretrained: no {CONFIG_NAME} in {folder}")
        model = cls(DrafterConfig.load(cfg_path))
        state = load_file(str(folder / WEIGHTS_NAME))
        # keep the checkpoint's dtype unless one is asked for
        model = model.to(dtype=dtype or state["lm_head.weight"].dtype)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"Drafter.from_pretrained: missing weights {missing}, unexpected {unexpected}")
        if model.vocab_map is not None:
            model.set_vocab_map(model.vocab_map.clone())  # validates the stored ids
        return model.to(device=device).eval()
