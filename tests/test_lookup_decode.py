"""The prompt-lookup beam in decode_step / generate: greedy exactness, exact sampling, the token
history, no host sync, bad input."""

from __future__ import annotations

import pytest
import torch
from helpers import random_drafter, random_target
from test_decode import BACKENDS, NoHostSync, _forbidden
from test_sampling import chi_square

import redrafter_ext as rx
from redrafter_ext.decode import _start, _with_lookup_beam
from redrafter_ext.policy import SpeculationPolicy

# repeats inside the prompts, so that keys occur and the lookup beam proposes real continuations
PROMPTS_3 = [[5, 17, 3, 9, 22, 5, 17, 3, 9, 41, 8], [60, 2, 60, 2, 60], [11, 12, 13, 14, 11, 12]]


@pytest.fixture(scope="module")
def target():
    return random_target(vocab=97, hidden=64, layers=2, seed=0)


@pytest.fixture(scope="module")
def ar3(target):
    return rx.autoregressive_generate(target, PROMPTS_3, 40)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("W,L,lookup", [(1, 2, 1), (1, 4, 2), (2, 3, 3), (4, 4, 2), (3, 6, 1), (1, 1, 2)])
def test_greedy_exact_with_lookup(target, ar3, backend, W, L, lookup):
    out = rx.generate(target, random_drafter(target, seed=W + L), PROMPTS_3, 40, beam_width=W, beam_length=L,
                      ops=BACKENDS[backend], lookup=lookup)
    assert out.tokens == ar3.tokens
    st = out.state
    for b, (p, t) in enumerate(zip(PROMPTS_3, out.tokens)):  # the history holds prompt + output
        n = int(st.cache_len[b])
        assert st.history[b, :n].tolist() == (p + t)[:n]
    if L > 1:  # the lookup drafts take the last beam's place: no node more than the drafter's trie
        assert max(st.nodes.tolist()) <= (1 + W * (L - 1)) * max(st.steps.tolist())


def test_greedy_exact_with_lookup_eos_and_policy(target, ar3):
    eos = ar3.tokens[0][9]
    ar = rx.autoregressive_generate(target, PROMPTS_3, 40, eos_id=eos)
    out = rx.generate(target, random_drafter(target), PROMPTS_3, 40, beam_width=2, beam_length=5, eos_id=eos, lookup=2)
    assert out.tokens == ar.tokens
    policy = SpeculationPolicy(menu=((1, 1), (1, 3), (2, 4)), probe=2)  # switches between AR and drafting
    out = rx.generate(target, random_drafter(target), PROMPTS_3, 40, policy=policy, eos_id=eos, lookup=2)
    assert out.tokens == ar.tokens
    st = out.state
    for b, (p, t) in enumerate(zip(PROMPTS_3, out.tokens)):
        assert st.history[b, : int(st.cache_len[b])].tolist() == (p + t)[: int(st.cache_len[b])]


def test_lookup_beam_content(target):
    # rows: a key that occurred (its continuation replaces the last beam), and one that never did
    # (the drafter's beams unchanged)
    state = _start(target, [[4, 5, 6, 7, 4, 5], [1, 2, 3]], 8, 9, None, None, history=True)
    state.token.copy_(torch.tensor([6, 9], dtype=torch.int32))
    beams = torch.tensor([[[6, 1, 1, 1], [6, 3, 3, 3]], [[9, 2, 2, 2], [9, 8, 8, 8]]], dtype=torch.int32)
    got = _with_lookup_beam(state, beams, 2, rx.ops)
    assert got.shape == (2, 2, 4) and got.dtype == torch.int32
    assert got[:, 0].tolist() == beams[:, 0].tolist()
    # row 0: history 4 5 6 7 4 5 + token 6, key (5, 6) at 1..2: continuation 7 4 5
    assert got[:, 1].tolist() == [[6, 7, 4, 5], [9, 8, 8, 8]]
    # W = 1: the only beam gives way where a key occurred
    got = _with_lookup_beam(state, beams[:, 1:], 2, rx.ops)
    assert got.tolist() == [[[6, 7, 4, 5]], [[9, 8, 8, 8]]]


@pytest.mark.parametrize("seed", [0, 2])
def test_lookup_beam_is_accepted_where_the_text_repeats(seed):
    # a small random target's greedy output falls into a cycle (seed 2: period 2, then 6): the lookup
    # beam proposes the cycle, so a drafter that is always wrong (it drafts a token the output never
    # holds) still commits several tokens a step, also at W = 1 where the lookup drafts replace its beam
    target = random_target(vocab=5, hidden=32, layers=1, seed=seed)
    prompt = [[1, 3, 1, 3, 1, 3]]
    ar = rx.autoregressive_generate(target, prompt, 64)
    never = min(set(range(5)) - set(ar.tokens[0]))

    class Wrong:
        def beam_search(self, hidden, token, embed_weight, W, L, ops):
            drafts = torch.full((token.shape[0], W, L - 1), never, dtype=torch.int32)
            return torch.cat([token[:, None, None].expand(-1, W, 1).to(torch.int32), drafts], 2)

    off = rx.generate(target, Wrong(), prompt, 64, beam_width=1, beam_length=4, lookup=0)
    on = rx.generate(target, Wrong(), prompt, 64, beam_width=1, beam_length=4, lookup=2)
    assert on.tokens == off.tokens == ar.tokens
    assert off.steps[0] == 64  # the drafter alone never gets a draft accepted
    assert on.steps[0] <= 0.6 * off.steps[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_with_lookup_never_syncs(target, backend, monkeypatch):
    state = _start(target, PROMPTS_3, 16, 1 + 5 * 3, None, None, history=True)
    drafter = random_drafter(target)
    for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
    sampling = rx.SamplingParams(0.8, generator=torch.Generator().manual_seed(0))
    with NoHostSync():
        for s in (None, sampling, None):
            rx.decode_step(target, drafter, state, beam_width=4, beam_length=4, ops=BACKENDS[backend], lookup=2,
                           sampling=s)
    monkeypatch.undo()
    assert int(state.num_out.min()) >= 3


def test_sampling_with_lookup_follows_the_target():
    # the first two sampled tokens of 4,000 rows (one prompt whose keys recur) against the target's
    # exact joint distribution: the lookup beam is a point-mass proposal like every draft
    target = random_target(vocab=7, hidden=32, layers=1, seed=3, std=2.0)
    prompt = [1, 2, 3, 1, 2, 3, 1, 2]
    B, T = 4000, 0.9
    out = rx.generate(target, random_drafter(target, seed=4), [prompt] * B, 2, beam_width=1, beam_length=3,
                      temperature=T, seed=5, lookup=2)
    got = torch.tensor(out.tokens)
    obs = torch.bincount(got[:, 0] * 7 + got[:, 1], minlength=49).double()
    with torch.no_grad():
        seqs = torch.tensor([prompt + [a] for a in range(7)])
        n = seqs.shape[1]
        kv = target.new_kv_cache(7, n)
        mask = rx.models.causal_tree_mask(torch.full((7,), n), n)
        logits, _ = target(seqs, torch.arange(n)[None].expand(7, n), mask, torch.zeros(7, dtype=torch.int32), kv)
    p1 = torch.softmax(logits[0, -2].double() / T, -1)  # the prompt's next token
    p2 = torch.softmax(logits[:, -1].double() / T, -1)  # [a, next]
    expected = (p1[:, None] * p2).reshape(49) * B
    stat, dof, pval = chi_square(obs, expected)
    assert pval > 1e-3, f"chi2 {stat:.1f} on {dof} dof, p = {pval:.2e}"
    assert out.tokens_per_step > 1.0


def test_lookup_is_on_by_default_in_generate_and_batch(target):
    drafter = random_drafter(target)
    kw = dict(beam_width=2, beam_length=3)
    on = rx.generate(target, drafter, PROMPTS_3, 16, **kw)
    assert on.state.history is not None
    assert on.steps == rx.generate(target, drafter, PROMPTS_3, 16, lookup=2, **kw).steps
    assert rx.generate(target, drafter, PROMPTS_3, 16, lookup=0, **kw).state.history is None
    batch = rx.Batch(target, 2, 8, 64)
    assert batch.lookup == 2 and batch.state.history is not None
    assert rx.Batch(target, 2, 8, 64, lookup=0).state.history is None


def test_lookup_rejects_bad_arguments(target):
    drafter = random_drafter(target)
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="generate: lookup must be"):
            rx.generate(target, drafter, PROMPTS_3, 4, beam_width=2, beam_length=3, lookup=bad)
    state = _start(target, PROMPTS_3, 8, 13, None, None)  # no history
    with pytest.raises(ValueError, match="decode_step: lookup=2 needs state.history"):
        rx.decode_step(target, drafter, state, beam_width=2, beam_length=3, lookup=2)
    state = _start(target, PROMPTS_3, 8, 13, None, None, history=True)
    for bad, msg in ((state.history[:, :-1].contiguous(), "state.history must have S"),
                     (state.history.long(), "state.history must have dtype"),
                     (state.history[:2], "state.history has batch 2")):
        st = _start(target, PROMPTS_3, 8, 13, None, None, history=True)
        st.history = bad
        before = st.cache_len.clone()
        with pytest.raises((ValueError, TypeError), match=msg):
            rx.decode_step(target, drafter, st, beam_width=2, beam_length=3, lookup=2)
        assert torch.equal(st.cache_len, before)
    # the lookup beam adds no node: a cache with room for exactly N = 1 + 2*2 slots past cache_len is
    # enough for W=2 L=3 with it; W=3 (N = 7) overflows, lookup or not
    room = _start(target, [[1, 2, 3]], 2, 3, None, None, history=True).cache_len.tolist()[0] + 5
    st = _start(target, [[1, 2, 3]], 2, 3, None, room, history=True)  # slack L: the output columns
    before = st.cache_len.clone()
    for lookup in (0, 2):
        with pytest.raises(ValueError, match="cache overflow"):
            rx.decode_step(target, drafter, st, beam_width=3, beam_length=3, lookup=lookup)
        assert torch.equal(st.cache_len, before)
    rx.decode_step(target, drafter, st, beam_width=2, beam_length=3, lookup=2)


def test_decode_step_with_lookup_compiles_fullgraph():
    # the lookup beam adds the op (its fake kernel traces it) and two scatters: still one graph
    target = random_target(vocab=61, hidden=32, layers=1, seed=2)
    drafter = random_drafter(target, layers=1)
    prompts = [[1, 2, 3, 1, 2], [4, 5, 6, 7, 8, 4, 5]]
    ar = rx.autoregressive_generate(target, prompts, 12)
    state = _start(target, prompts, 12, 10, None, None, history=True)
    step = torch.compile(
        lambda s: rx.decode_step(target, drafter, s, beam_width=3, beam_length=3, ops=rx.ops, lookup=2),
        fullgraph=True,
    )
    for _ in range(12):
        step(state)
    n = state.num_out.tolist()
    assert [state.out[b, : n[b]].tolist() for b in range(2)] == ar.tokens
