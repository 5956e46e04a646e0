"""decode_step / generate: greedy exactness, no host sync, KV compaction, bad input."""

from __future__ import annotations

import pytest
import torch
from helpers import OracleDrafter, random_drafter, random_target
from torch.utils._python_dispatch import TorchDispatchMode

import redrafter_ext as rx
from redrafter_ext.decode import SamplingParams, _start

BACKENDS = {"native": rx.ops, "reference": rx.reference}
PROMPTS_3 = [[5, 17, 3, 9, 22, 41, 8], [60, 2], [11, 12, 13, 14]]
WL = [(1, 2), (2, 3), (4, 4), (3, 6), (1, 5), (5, 2)]


@pytest.fixture(scope="module")
def target():
    return random_target(vocab=97, hidden=64, layers=2, seed=0)


@pytest.fixture(scope="module")
def ar3(target):
    return rx.autoregressive_generate(target, PROMPTS_3, 48)


def test_target_output_is_varied(ar3):
    for row in ar3.tokens:
        assert len(set(row)) >= 15, row  # a random target that repeats one token would prove little


def run_oracle(target, prompts, ar, W, L, ops, max_new=48, eos_id=None):
    state = _start(target, prompts, max_new, 1 + W * (L - 1), eos_id, None)
    ref = torch.tensor([r + [0] * (max_new + L - len(r)) for r in ar.tokens])
    drafter = OracleDrafter(ref, state.num_out, target.vocab_size)
    for _ in range(max_new):
        rx.decode_step(target, drafter, state, beam_width=W, beam_length=L, ops=ops)
        if bool(state.done.all()):
            break
    n = state.num_out.tolist()
    return [state.out[b, : n[b]].tolist() for b in range(len(n))], state


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("W,L", WL)
def test_greedy_exact_oracle_drafter(target, ar3, backend, W, L):
    tokens, state = run_oracle(target, PROMPTS_3, ar3, W, L, BACKENDS[backend])
    assert tokens == ar3.tokens
    # the oracle's beam is always accepted in full: ceil(48 / L) steps per row
    assert state.steps.tolist() == [-(-48 // L)] * 3


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("W,L", WL)
def test_greedy_exact_random_drafter(target, ar3, backend, W, L):
    drafter = random_drafter(target, seed=W * 10 + L)
    out = rx.generate(target, drafter, PROMPTS_3, 48, beam_width=W, beam_length=L, ops=BACKENDS[backend])
    assert out.tokens == ar3.tokens


@pytest.mark.parametrize("W,L", [(1, 2), (4, 4)])
def test_greedy_exact_batch1(target, W, L):
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6]]
    ar = rx.autoregressive_generate(target, prompt, 40)
    tokens, _ = run_oracle(target, prompt, ar, W, L, rx.ops, max_new=40)
    assert tokens == ar.tokens
    out = rx.generate(target, random_drafter(target), prompt, 40, beam_width=W, beam_length=L)
    assert out.tokens == ar.tokens


def test_eos_and_max_new_tokens(target, ar3):
    # pick an EOS that occurs mid-output in row 0: every row must stop exactly where AR stops
    eos = ar3.tokens[0][10]
    ar = rx.autoregressive_generate(target, PROMPTS_3, 48, eos_id=eos)
    assert ar.tokens[0][-1] == eos and len(ar.tokens[0]) <= 11
    for W, L in [(1, 2), (4, 4), (2, 6)]:
        tokens, state = run_oracle(target, PROMPTS_3, ar3, W, L, rx.ops, eos_id=eos)
        assert tokens == ar.tokens
        # a finished row's cache stops growing
        assert state.cache_len.tolist() == [len(p) + len(t) for p, t in zip(PROMPTS_3, ar.tokens)]
        out = rx.generate(target, random_drafter(target), PROMPTS_3, 48, beam_width=W, beam_length=L, eos_id=eos)
        assert out.tokens == ar.tokens


def test_max_new_tokens_zero_and_one(target):
    for n in (0, 1):
        ar = rx.autoregressive_generate(target, PROMPTS_3, n)
        out = rx.generate(target, random_drafter(target), PROMPTS_3, n, beam_width=3, beam_length=3)
        assert out.tokens == ar.tokens and all(len(t) == n for t in out.tokens)


@pytest.mark.parametrize("W,L", [(1, 2), (3, 4)])
def test_kv_cache_equals_autoregressive(target, ar3, W, L):
    ar = rx.autoregressive_generate(target, PROMPTS_3, 48)
    _, state = run_oracle(target, PROMPTS_3, ar3, W, L, rx.ops)
    rnd = rx.generate(target, random_drafter(target), PROMPTS_3, 48, beam_width=W, beam_length=L).state
    for st in (state, rnd):
        assert torch.equal(st.cache_len, ar.state.cache_len)
        for b, n in enumerate(ar.state.cache_len.tolist()):
            torch.testing.assert_close(st.kv[:, :, b, :, :n], ar.state.kv[:, :, b, :, :n], atol=2e-5, rtol=1e-4)


# ---- no host synchronisation inside decode_step ----------------------------------------------
aten = torch.ops.aten
BANNED = {
    aten._local_scalar_dense, aten.nonzero, aten.nonzero_static, aten.masked_select, aten.unique_dim,
    aten._unique, aten._unique2, aten.unique_consecutive, aten.argwhere, aten.repeat_interleave,
    aten.masked_scatter, aten.item,
}


class NoHostSync(TorchDispatchMode):
    """Fails on any op that reads a value on the host or has a data-dependent output shape."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in BANNED:
            raise AssertionError(f"host sync / data-dependent op in decode_step: {func}")
        if func.overloadpacket in (aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            if any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in indices if t is not None):
                raise AssertionError(f"boolean-mask indexing in decode_step: {func}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_never_syncs(target, ar3, backend, monkeypatch):
    ops = BACKENDS[backend]
    for drafter_kind in ("random", "oracle"):
        state = _start(target, PROMPTS_3, 16, 13, ar3.tokens[1][3], None)
        ref = torch.tensor([r[:16] + [0] * 8 for r in ar3.tokens])
        drafter = random_drafter(target) if drafter_kind == "random" else OracleDrafter(ref, state.num_out, 97)
        steps_without_host_sync(monkeypatch, target, drafter, state, ops)


def steps_without_host_sync(monkeypatch, target, drafter, state, ops, steps=3):
    """``steps`` decode steps that fail on any host read, then at least ``steps`` tokens per row."""
    # Python-level host reads are caught too (they need not dispatch an aten op)
    for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
    with NoHostSync():
        for _ in range(steps):
            rx.decode_step(target, drafter, state, beam_width=4, beam_length=4, ops=ops)
    monkeypatch.undo()
    assert int(state.num_out.min()) >= steps


def _forbidden(name):
    def f(self, *a, **k):
        raise AssertionError(f"Tensor.{name} called inside decode_step")

    return f


def test_no_sync_mode_catches_violations():
    # negative control: the mode really fails on the usual offenders
    x = torch.tensor([1, 0, 2])
    for bad in (lambda: x.sum().item(), lambda: x.nonzero(), lambda: x[x > 0], lambda: torch.unique(x)):
        with pytest.raises(AssertionError), NoHostSync():
            bad()


# ---- bad input -----------------------------------------------------------------------------
def test_generate_rejects_bad_prompts(target):
    d = random_drafter(target)
    with pytest.raises(ValueError, match=r"prompts\[1\] has token id 97"):
        rx.generate(target, d, [[1, 2], [3, 97]], 4)
    with pytest.raises(ValueError, match="prompts"):
        rx.generate(target, d, torch.zeros(2, 3, 4, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"prompts\[0\] is empty"):
        rx.generate(target, d, [[]], 4)
    with pytest.raises(ValueError, match="max_len"):
        rx.generate(target, d, [[1, 2, 3]], 8, beam_width=4, beam_length=4, max_len=16)


def test_decode_step_rejects_bad_state_without_writing(target):
    d = random_drafter(target)
    state = _start(target, [[1, 2, 3]], 8, 4, None, None)
    kv0, len0 = state.kv.clone(), state.cache_len.clone()

    def expect(match, **kw):
        with pytest.raises((ValueError, TypeError), match=match):
            rx.decode_step(target, d, state, **({"beam_width": 2, "beam_length": 3} | kw))
        assert torch.equal(state.kv, kv0) and torch.equal(good, len0)

    good = state.cache_len
    # W*(L-1)+1 > cache room
    expect(r"N = 1 \+ W\*\(L-1\) = 33", beam_width=8, beam_length=5)
    state.cache_len = good.long()
    expect("state.cache_len must have dtype")
    state.cache_len = good[None]
    expect("state.cache_len must have 1 dims")
    state.cache_len = good.to("meta")
    expect("state.cache_len is on meta")
    state.cache_len = good
    expect("beam_width", beam_width=0)


def test_reference_ops_reject_bad_input():
    with pytest.raises(ValueError, match="beams must have 3 dims"):
        rx.reference.build_trie(torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(TypeError, match="beams must have dtype"):
        rx.reference.build_trie(torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match="num_nodes is on meta"):
        rx.reference.tree_mask(torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match="step must be an int"):
        rx.reference.beam_topk(torch.zeros(1, 2, 5), torch.zeros(1, 2), torch.zeros(1, 2, 3, dtype=torch.int32),
                               torch.zeros(1, 2, 1), 3)
    with pytest.raises(ValueError, match="logits must cover"):
        rx.reference.verify_greedy(torch.zeros(1, 3, 5), torch.zeros(1, 2, 3, dtype=torch.int32),
                                   torch.zeros(1, 2, 3, dtype=torch.int32))


def test_decode_step_compiles_fullgraph():
    # the whole step (drafter, native ops, target, commit) is one graph: no breaks, no host syncs
    target = random_target(vocab=61, hidden=32, layers=1, seed=2)
    drafter = random_drafter(target, layers=1)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    ar = rx.autoregressive_generate(target, prompts, 12)
    state = _start(target, prompts, 12, 7, None, None)
    step = torch.compile(
        lambda s: rx.decode_step(target, drafter, s, beam_width=3, beam_length=3, ops=rx.ops), fullgraph=True
    )
    for _ in range(12):
        step(state)
    n = state.num_out.tolist()
    assert [state.out[b, : n[b]].tolist() for b in range(2)] == ar.tokens


def test_decode_step_with_sampling_compiles_fullgraph():
    # uniforms passed in as tensors: the sampling step is one graph, equal to eager
    tgt = random_target(vocab=61, hidden=32, layers=1, seed=2)
    drafter = random_drafter(tgt, layers=1)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    sampling = SamplingParams(0.9, 10, 0.95)

    def run(step_fn):
        state = _start(tgt, prompts, 12, 7, None, None)
        g = torch.Generator().manual_seed(0)
        for _ in range(6):
            step_fn(state, (torch.rand(2, 2, 3, generator=g), torch.rand(2, generator=g)))
        return state.out.clone()

    def step(s, u):
        return rx.decode_step(tgt, drafter, s, beam_width=3, beam_length=3, ops=rx.ops, sampling=sampling, uniforms=u)

    assert torch.equal(run(step), run(torch.compile(step, fullgraph=True)))
