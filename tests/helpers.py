"""Test models: a random target with varied greedy output, and drafters good and bad."""

from __future__ import annotations

import torch
from torch import Tensor

from redrafter_ext import Drafter, DrafterConfig, LlamaConfig, LlamaTarget
from redrafter_ext.drafter import beam_search


def random_target(vocab: int = 97, hidden: int = 64, layers: int = 2, seed: int = 0, std: float = 1.0) -> LlamaTarget:
    """Random Llama whose weights are large enough that greedy tokens vary with context."""
    g = torch.Generator().manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = LlamaTarget(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layernorm" in name or name == "norm":
                continue
            p.copy_(torch.randn(p.shape, generator=g) * std / p.shape[-1] ** 0.5 * (4.0 if "embed" in name else 1.0))
    return model.eval()


def random_drafter(target: LlamaTarget, seed: int = 1, layers: int = 1) -> Drafter:
    torch.manual_seed(seed)
    return Drafter(DrafterConfig(target.hidden_size, target.vocab_size, layers)).eval()


class OracleDrafter:
    """Proposes the known greedy continuation in one beam (long acceptance), noise elsewhere.

    ``reference`` (B, T_ref) holds each row's AR output; ``num_out`` is the decode state's
    tensor of tokens already written, read by tensor ops only (no host sync). The beam that has
    followed the reference so far gets a large logit on the next reference token.
    """

    def __init__(self, reference: Tensor, num_out: Tensor, vocab: int, seed: int = 0) -> None:
        self.ref = reference.to(torch.int64)
        self.num_out = num_out
        self.vocab = vocab
        self.gen = torch.Generator().manual_seed(seed)

    def beam_search(self, hidden, token, embed_weight, beam_width, beam_length, ops):
        B = token.shape[0]
        T = self.ref.shape[1]
        # state: (on_track, position in the reference of the previous token)
        state0 = torch.zeros(B, beam_width, 2)
        state0[:, :, 0] = 1.0
        state0[:, :, 1] = self.num_out.float()[:, None]

        def step(prev: Tensor, state: Tensor):
            pos = state[:, :, 1].long()
            on = (state[:, :, 0] > 0) & (prev.long() == torch.gather(self.ref, 1, pos.clamp(max=T - 1)))
            nxt = torch.gather(self.ref, 1, (pos + 1).clamp(max=T - 1))
            logits = torch.randn(B, prev.shape[1], self.vocab, generator=self.gen)
            logits.scatter_add_(2, nxt[:, :, None], on[:, :, None].float() * 30.0)
            return logits, torch.stack([on.float(), (pos + 1).float()], dim=-1)

        return beam_search(step, state0, token, beam_width, beam_length, ops)


# generate's argument errors, the same on both backends: (prompts, max_new_tokens, exception, message)
BAD_GENERATE_ARGS = [
    ("def main():", 4, TypeError, "prompts is a string: tokenize it first"),
    ([1, 2, 3], 4, TypeError, r"flat list of ints; for one prompt pass \[\[1, \.\.\.\]\]"),
    ([[1, 2, 3]], 2.5, ValueError, "max_new_tokens must be an int >= 0, got 2.5"),
    ([[1, 2.5, 3]], 4, TypeError, r"prompts\[0\]\[1\] = 2.5 is not an int token id"),
    ([[True, 2]], 4, TypeError, r"prompts\[0\]\[0\] = True is not an int token id"),
]

# generate's beam-shape errors, raised before anything runs, the same on both backends:
# (keywords, max_new_tokens, message); with max_new_tokens=0 no decode_step runs to check them
BAD_BEAM_SHAPES = [
    (dict(beam_length=0), 4, "generate: beam_length must be an int >= 1, got 0"),
    (dict(beam_width=0), 0, "generate: beam_width must be an int >= 1, got 0"),
    (dict(beam_width=2.0), 4, r"generate: beam_width must be an int >= 1, got 2\.0"),
    (dict(beam_length=True), 0, "generate: beam_length must be an int >= 1, got True"),
]
