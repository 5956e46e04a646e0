"""Batched decoding on the shipped model (greedy): rows are independent and nothing is realigned.

* every row of a batch of 3 or 7 (mixed prompt lengths, rows stopping at EOS or at max_new_tokens
  at different steps) equals its batch-1 output, which equals plain AR;
* within a step the cache is written only by the target's tree write (slots cache_len..+N-1) and by
  ``kv_compact`` (slots cache_len..+accepted), exactly once each, in the same storage;
* a finished row stops: its cache_len / num_out stay, ``kv_compact`` gets accept_len = -1 for it and
  leaves its row bytewise unchanged, and its committed slots never change again.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import torch

import redrafter_ext as rx
from redrafter_ext import ops as native_ops
from redrafter_ext.decode import _start
from redrafter_ext.demo import CHECKPOINTS, load_models, load_prompt_ids
from redrafter_ext.reference import num_nodes_max

MAX_NEW = 40
LENGTHS = [9, 40, 23, 57, 14, 31, 48]  # prompt lengths of the 7 rows (3-row cases take the first 3)


@pytest.fixture(scope="module")
def shipped():
    target, drafter, tok, _ = load_models(CHECKPOINTS, random_weights=False)
    raw = load_prompt_ids(tok, len(LENGTHS), 400, target.vocab_size)
    prompts = [p[:n] for p, n in zip(raw, LENGTHS)]
    assert [len(p) for p in prompts] == LENGTHS
    # the free-running greedy continuation of each prompt (no EOS), one row at a time
    free = [rx.autoregressive_generate(target, [p], MAX_NEW).tokens[0] for p in prompts]
    return target, drafter, prompts, free, pick_eos(free)


def pick_eos(free: list[list[int]]) -> int:
    """A token that most rows emit, first at distinct steps, while at least 2 rows never emit it
    (those run to max_new_tokens): rows then stop at different steps for both reasons."""
    first: dict[int, dict[int, int]] = {}
    for r, row in enumerate(free):
        for i, t in enumerate(row[: MAX_NEW - 2]):
            first.setdefault(t, {}).setdefault(r, i)
    ok = [(len(set(pos.values())), t) for t, pos in first.items() if len(pos) <= len(free) - 2 and len(pos) >= 2]
    ok += [(len(set(pos.values())), t) for t, pos in first.items() if len(free) <= 3 and len(pos) == 1]
    return max(ok)[1]


def truncate_at(row: list[int], eos: int) -> list[int]:
    return row[: row.index(eos) + 1] if eos in row else row


@pytest.mark.parametrize("B,W,L", [(3, 1, 8), (7, 2, 4), (7, 1, 8)])
def test_each_row_equals_its_batch1_output(shipped, B, W, L):
    target, drafter, prompts, free, eos = shipped
    prompts, free = prompts[:B], free[:B]
    want = [truncate_at(r, eos) for r in free]
    stops = Counter("eos" if r[-1] == eos and len(r) <= MAX_NEW else "max" for r in want)
    assert stops["eos"] >= 1 and stops["max"] >= 1, "the eos choice must stop some rows early and not others"
    one = [rx.generate(target, drafter, [p], MAX_NEW, beam_width=W, beam_length=L, eos_id=eos).tokens[0]
           for p in prompts]
    assert one == want  # batch 1 equals AR
    out = rx.generate(target, drafter, prompts, MAX_NEW, beam_width=W, beam_length=L, eos_id=eos)
    assert out.tokens == one
    ar = rx.autoregressive_generate(target, prompts, MAX_NEW, eos_id=eos)
    assert ar.tokens == one
    assert len({len(r) for r in out.tokens}) > 1 and len(set(out.steps)) > 1  # rows stop at different steps


class WatchedTarget:
    """Passes the protocol through and records what each forward wrote into the cache."""

    def __init__(self, inner, log: list) -> None:
        self.inner, self.log = inner, log
        self.vocab_size, self.hidden_size, self.embed_weight = inner.vocab_size, inner.hidden_size, inner.embed_weight

    def __call__(self, tokens, positions, tree_mask, cache_len, kv):
        before, cl = kv.clone(), cache_len.clone()
        out = self.inner(tokens, positions, tree_mask, cache_len, kv)
        assert torch.equal(cache_len, cl), "the target must not advance cache_len"
        self.log.append(SimpleNamespace(op="forward", before=before, after=kv.clone(), cache_len=cl, T=tokens.shape[1]))
        return out


def watched_ops(log: list) -> SimpleNamespace:
    """The native ops, with kv_compact recording its arguments and the cache before and after."""
    def kv_compact(kv, cache_len, path_nodes, accept_len):
        before, cl = kv.clone(), cache_len.clone()
        native_ops.kv_compact(kv, cache_len, path_nodes, accept_len)
        log.append(SimpleNamespace(op="kv_compact", before=before, after=kv.clone(), cache_len=cl,
                                   cache_len_after=cache_len.clone(), accept_len=accept_len.clone()))

    names = ("tree_mask", "beam_topk", "build_trie", "verify_greedy", "verify_sample")
    return SimpleNamespace(**{n: getattr(native_ops, n) for n in names}, kv_compact=kv_compact)


def changed_slots(before: torch.Tensor, after: torch.Tensor, b: int) -> set[int]:
    """Cache slots of row b that differ in any layer, K or V, head or channel."""
    diff = (before[:, :, b] != after[:, :, b]).any(dim=(0, 1, 2, 4))
    return set(torch.nonzero(diff).flatten().tolist())


@pytest.mark.parametrize("B,W,L", [(3, 1, 8), (7, 2, 4)])
def test_cache_written_only_by_tree_write_and_compaction(shipped, B, W, L):
    target, drafter, prompts, free, eos = shipped
    prompts = prompts[:B]
    N = num_nodes_max(W, L)
    log: list = []
    tgt, ops = WatchedTarget(target, log), watched_ops(log)
    state = _start(target, prompts, MAX_NEW, max(N, L), eos, None)
    ptr, S = state.kv.data_ptr(), state.kv.shape[4]
    finished_at: dict[int, tuple[int, int, int, torch.Tensor]] = {}  # row -> (step, cache_len, num_out, committed kv)
    for step in range(MAX_NEW):
        log.clear()
        kv0, done0 = state.kv.clone(), state.done.clone()
        rx.decode_step(tgt, drafter, state, beam_width=W, beam_length=L, ops=ops)
        assert state.kv.data_ptr() == ptr  # same storage: nothing reallocated
        assert [e.op for e in log] == ["forward", "kv_compact"]  # one tree write, one compaction
        fwd, cmp = log
        # nothing but these two touched the cache: drafting, trie, verify and commit left it alone
        assert torch.equal(kv0, fwd.before) and torch.equal(fwd.after, cmp.before) and torch.equal(cmp.after, state.kv)
        for b in range(B):
            c = int(fwd.cache_len[b])
            assert changed_slots(fwd.before, fwd.after, b) <= set(range(c, min(c + N, S)))  # the tree write only
            a = int(cmp.accept_len[b])
            if bool(done0[b]):
                # finished row: no compaction, no advance, bytewise unchanged by kv_compact
                assert a == -1 and int(cmp.cache_len_after[b]) == c
                assert torch.equal(cmp.before[:, :, b], cmp.after[:, :, b])
            else:
                assert 0 <= a <= L - 1 and int(cmp.cache_len_after[b]) == c + a + 1
                assert changed_slots(cmp.before, cmp.after, b) <= set(range(c, c + a + 1))
        for b in range(B):
            if bool(state.done[b]) and b not in finished_at:
                n = int(state.cache_len[b])
                finished_at[b] = (step, n, int(state.num_out[b]), state.kv[:, :, b, :, :n].clone())
        if bool(state.done.all()):
            break
    assert len(finished_at) == B
    assert len({s for s, *_ in finished_at.values()}) > 1  # rows finished at different steps
    for b, (_, n, num_out, committed) in finished_at.items():
        assert int(state.cache_len[b]) == n and int(state.num_out[b]) == num_out  # stopped growing
        assert torch.equal(state.kv[:, :, b, :, :n], committed)  # committed slots bytewise unchanged
    got = [state.out[b, : int(state.num_out[b])].tolist() for b in range(B)]
    assert got == [truncate_at(r, eos) for r in free[:B]]
