"""decode_step / generate: greedy exactness, no host sync, KV compaction, bad input."""

from __future__ import annotations

import pytest
import torch
from helpers import BAD_BEAM_SHAPES, BAD_GENERATE_ARGS, OracleDrafter, random_drafter, random_target
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


# ---- cache room, state checks, generate's arguments ------------------------------------------------
def test_decode_step_cache_overflow_raises_naming_the_row(target):
    # S = 12 slots, W=2 L=3 -> N = 5: row 1 at cache_len 8 needs 13. Before anything is written, the
    # step must name the row and the room; a step that is allowed to run anyway would index past S.
    d = random_drafter(target)
    state = _start(target, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]], 4, 4, None, None)
    state.kv = state.kv[:, :, :, :, :12].contiguous()
    kv0, len0, out0 = state.kv.clone(), state.cache_len.clone(), state.out.clone()
    with pytest.raises(ValueError, match=r"row 1: cache_len = 8.* N = 1 \+ W\*\(L-1\) = 5.* needs 13 .* S = 12"):
        rx.decode_step(target, d, state, beam_width=2, beam_length=3)
    assert torch.equal(state.kv, kv0) and torch.equal(state.cache_len, len0) and torch.equal(state.out, out0)
    state.cache_len[1] = -1
    with pytest.raises(ValueError, match="row 1: cache_len = -1"):
        rx.decode_step(target, d, state, beam_width=2, beam_length=3)
    # exactly enough room (cache_len = S - N) runs
    state.cache_len[1] = 7
    rx.decode_step(target, d, state, beam_width=2, beam_length=3)


def test_decode_step_rejects_bad_state_dtypes_without_writing(target):
    d = random_drafter(target)

    def fresh():
        return _start(target, [[1, 2, 3], [4, 5], [6]], 8, 4, None, None)

    for name, bad, match in [
        ("done", lambda t: t.to(torch.int32), "state.done must have dtype in .bool"),
        ("num_out", lambda t: t.long(), "state.num_out must have dtype in .int32"),
        ("steps", lambda t: t.float(), "state.steps must have dtype in .int32"),
        ("nodes", lambda t: t.to(torch.int16), "state.nodes must have dtype in .int32"),
        ("token", lambda t: t.long(), "state.token must have dtype in .int32"),
        ("hidden", lambda t: t.to(torch.int32), "state.hidden must have dtype"),
        ("kv", lambda t: t[:, :, :2].contiguous(), "state.kv has batch 2 but the other fields have B = 3"),
        ("done", lambda t: t[:2], "state.done has batch 2 but the other fields have B = 3"),
        ("max_new_tokens", lambda m: 2.5, "state.max_new_tokens must be an int"),
        ("eos_id", lambda e: 97, "state.eos_id must be None or an int"),
    ]:
        state = fresh()
        setattr(state, name, bad(getattr(state, name)))
        kv0 = state.kv.clone()
        snap = {f: getattr(state, f).clone() for f in ("cache_len", "out", "num_out", "token")}
        with pytest.raises((TypeError, ValueError), match=match):
            rx.decode_step(target, d, state, beam_width=2, beam_length=3)
        assert torch.equal(state.kv[:, :, : kv0.shape[2]], kv0), name
        assert all(torch.equal(getattr(state, f), v) for f, v in snap.items()), name


def test_generate_rejects_bad_arguments_by_name(target):
    d = random_drafter(target)
    for fn in (lambda p, n: rx.generate(target, d, p, n), lambda p, n: rx.autoregressive_generate(target, p, n)):
        for prompts, n, exc, message in BAD_GENERATE_ARGS:
            with pytest.raises(exc, match=message):
                fn(prompts, n)
        with pytest.raises(TypeError, match=r"prompts\[1\] is a string: tokenize it first"):
            fn([[1, 2], "abc"], 4)
        with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0, got True"):
            fn([[1, 2, 3]], True)
        with pytest.raises(TypeError, match=r"prompts\[0\]\[0\] = 1.0 is not an int token id"):
            fn(torch.tensor([[1.0, 2.0]]), 4)
        with pytest.raises(TypeError, match=r"prompts\[0\]\[0\] = True is not an int token id"):
            fn(torch.tensor([[True, False]]), 4)
        with pytest.raises(ValueError, match="eos_id must be None or an int"):
            rx.generate(target, d, [[1, 2]], 4, eos_id=3.0)
    # tensors and NumPy integers are token ids like Python ints
    assert rx.generate(target, d, torch.tensor([[1, 2, 3]]), 3).tokens == rx.generate(target, d, [[1, 2, 3]], 3).tokens


def test_generate_rejects_a_bad_beam_shape_before_any_step(target):
    d = random_drafter(target)
    for kw, n, message in BAD_BEAM_SHAPES:
        with pytest.raises(ValueError, match=message):
            rx.generate(target, d, [[1, 2, 3]], n, **kw)


@pytest.mark.parametrize("bad", [True, 2.0, 0])
def test_one_int_rule_for_every_argument(target, bad):
    # policy, serving and generate check ints by one rule (_scalar_checks): never a bool or a float
    with pytest.raises(ValueError, match=f"SpeculationPolicy: window must be an int >= 1, got {bad!r}"):
        rx.SpeculationPolicy(window=bad)
    with pytest.raises(ValueError, match=f"Batch: rows must be an int >= 1, got {bad!r}"):
        rx.Batch(target, rows=bad, max_new_tokens=4, max_len=32)
    with pytest.raises(ValueError, match=f"generate: check_every must be an int >= 1, got {bad!r}"):
        rx.generate(target, random_drafter(target), [[1, 2]], 4, check_every=bad)


def test_generate_stops_at_max_position_embeddings():
    target = random_target(vocab=31, hidden=32, layers=1, seed=5)
    target.config.max_position_embeddings = P = 24
    d = random_drafter(target, layers=1)
    with pytest.raises(ValueError, match=rf"prompts\[1\] has 5 tokens; .*reaches {P + 1} positions.*max_position_embeddings={P}"):
        rx.generate(target, d, [[1, 2], [1, 2, 3, 4, 5]], P - 4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        rx.autoregressive_generate(target, [[1, 2, 3, 4, 5]], P - 4)
    # exactly the context: prompt + max_new_tokens = P
    assert len(rx.generate(target, d, [[1, 2, 3, 4, 5]], P - 5, beam_width=2, beam_length=3).tokens[0]) == P - 5


# ------------------------------------------------------------------------------------------------
# the host reads of generate: no step after the last row finished (without EOS), few reads


def test_steps_until_check():
    from redrafter_ext._generate_common import steps_until_check

    assert steps_until_check(4, 13, 4, eos=False) == 4  # ceil(13 / 4): no row can finish sooner
    assert steps_until_check(4, 48, 4, eos=False) == 12  # no EOS: nothing to find before then
    assert steps_until_check(4, 48, 4, eos=True) == 4  # EOS may stop a row at any step
    assert steps_until_check(4, 1, 8, eos=True) == 1
    assert steps_until_check(4, 0, 8, eos=False) == 1


@pytest.mark.parametrize("W,L", [(1, 1), (2, 3), (4, 4), (1, 8)])
def test_generate_runs_no_step_after_the_last_row_finished(target, ar3, W, L):
    drafter = random_drafter(target, seed=W * 10 + L)
    for max_new in (13, 48):
        out = rx.generate(target, drafter, PROMPTS_3, max_new, beam_width=W, beam_length=L)
        assert out.tokens == [t[:max_new] for t in ar3.tokens]
        assert out.calls == max(out.steps), (max_new, out.calls, out.steps)
    ar = rx.autoregressive_generate(target, PROMPTS_3, 13)
    assert ar.calls == 13 == max(ar.steps)


def test_generate_with_eos_wastes_fewer_than_check_every_steps(target, ar3):
    eos = ar3.tokens[1][5]
    drafter = random_drafter(target, seed=3)
    want = rx.autoregressive_generate(target, PROMPTS_3, 48, eos_id=eos)
    for check_every in (1, 3, 4):
        out = rx.generate(target, drafter, PROMPTS_3, 48, beam_width=2, beam_length=3, eos_id=eos,
                          check_every=check_every)
        assert out.tokens == want.tokens
        assert 0 <= out.calls - max(out.steps) < check_every, (check_every, out.calls, out.steps)


def test_cpu_default_reads_every_step_so_no_step_runs_idle_at_eos(target, ar3):
    # on a CPU a host read costs nothing, so the default is to read after every step
    eos = ar3.tokens[1][5]
    drafter = random_drafter(target, seed=3)
    want = rx.autoregressive_generate(target, PROMPTS_3, 48, eos_id=eos)
    assert want.calls == max(want.steps)
    for kw in (dict(beam_width=2, beam_length=3), dict(policy=rx.SpeculationPolicy(menu=((1, 3), (2, 3)), window=3))):
        out = rx.generate(target, drafter, PROMPTS_3, 48, eos_id=eos, **kw)
        assert out.tokens == want.tokens
        assert out.calls == max(out.steps), (kw, out.calls, out.steps)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_generate_rejects_bad_check_every(target, bad):
    with pytest.raises(ValueError, match="check_every"):
        rx.generate(target, random_drafter(target), PROMPTS_3, 4, check_every=bad)
    with pytest.raises(ValueError, match="check_every"):
        rx.autoregressive_generate(target, PROMPTS_3, 4, check_every=bad)


@pytest.mark.parametrize("W,L", [(2, 3), (1, 1)])
def test_stage_timer_hooks_cover_the_step(target, W, L):
    # the timer wraps the models and ops from outside the step: same tokens, every stage accounted
    from redrafter_ext.profiling import STAGES, StageTimer

    drafter = random_drafter(target)
    timer = StageTimer()
    out = rx.generate(target, drafter, PROMPTS_3, 8, beam_width=W, beam_length=L, timer=timer)
    assert out.tokens == rx.generate(target, drafter, PROMPTS_3, 8, beam_width=W, beam_length=L).tokens
    split = timer.split()
    assert list(split) == list(STAGES)
    assert all(v >= 0 for v in split.values()), split
    assert sum(split.values()) == pytest.approx(timer.seconds["step"])
    assert timer.seconds["target"] > 0
    if L > 1:
        assert split["draft_rnn"] > 0 and split["beam_topk"] > 0 and split["trie"] > 0 and split["kv_compact"] > 0
