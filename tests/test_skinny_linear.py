"""``skinny_linear`` (native CPU) against its reference, its row independence, and its use in
``LlamaTarget`` (packed weights for forwards of few rows)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from cases import gen

import redrafter_ext as rx
import redrafter_ext.ops as ops
from redrafter_ext import reference as ref
from redrafter_ext.few_rows import SKINNY_MAX_ROWS


def _inputs(M, N, K, bias, seed):
    g = gen(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g) if bias else None
    return x, w, b


# M across the 4-row passes and the 16-tile blocks; N and K off the 4 x 16 tile
@pytest.mark.parametrize("M,N,K", [
    (1, 1, 1), (1, 111, 576), (2, 5, 17), (3, 7, 15), (4, 64, 16), (5, 33, 40), (7, 111, 33),
    (8, 130, 576), (9, 69, 64), (16, 257, 100), (33, 70, 31), (1, 4099, 20),
    (3, 37, 577), (4, 9, 1536), (5, 66, 95),  # the AVX2 path from 3 rows: its last chunk of 1 and 2
])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_linear(M, N, K, bias):
    x, w, b = _inputs(M, N, K, bias, seed=M * 1000 + N + K)
    p = ops.skinny_pack(w)
    got = ops.skinny_linear(x, p, N, b)
    assert got.shape == (M, N) and got.dtype == torch.float32
    want = F.linear(x.double(), w.double(), None if b is None else b.double()).float()
    # float32 sums of K products: a few ulp of the largest partial sum
    torch.testing.assert_close(got, want, atol=2e-6 * K ** 0.5 * 4, rtol=1e-5)
    torch.testing.assert_close(ref.skinny_linear(x, p, N, b), want, atol=2e-6 * K ** 0.5 * 4, rtol=1e-5)


def test_empty_sizes():
    w = torch.randn(5, 0)
    b = torch.randn(5)
    assert torch.equal(ops.skinny_linear(torch.randn(3, 0), ops.skinny_pack(w), 5, b), b.expand(3, 5))
    assert torch.equal(ops.skinny_linear(torch.randn(3, 0), ops.skinny_pack(w), 5), torch.zeros(3, 5))
    assert ops.skinny_linear(torch.randn(0, 8), ops.skinny_pack(torch.randn(5, 8)), 5).shape == (0, 5)
    assert ops.skinny_linear(torch.randn(2, 8), ops.skinny_pack(torch.randn(0, 8)), 0).shape == (2, 0)


def test_pack_layout():
    w = torch.arange(6 * 19, dtype=torch.float32).reshape(6, 19)
    p = ops.skinny_pack(w)
    assert p.shape == (2, 2, 4, 16) and p.is_contiguous()
    for t, j, r, i in itertools.product(range(2), range(2), range(4), range(16)):
        n, k = 4 * t + r, 16 * j + i
        assert p[t, j, r, i] == (w[n, k] if n < 6 and k < 19 else 0)


@pytest.mark.parametrize("threads", [1, 2])
def test_each_row_independent_of_the_others(threads):
    """A row's output is bit-identical alone, in any batch, and under any thread split: so a tree
    verify's linears equal a one-token step's."""
    x, w, b = _inputs(37, 1000, 577, True, seed=7)
    p = ops.skinny_pack(w)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        full = ops.skinny_linear(x, p, 1000, b)
        for M in (1, 2, 3, 4, 5, 8, 9, 17):
            for start in (0, 3, 37 - M):
                assert torch.equal(ops.skinny_linear(x[start:start + M], p, 1000, b), full[start:start + M]), (M, start)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(ops.skinny_linear(x, p, 1000, b), full)


def test_opcheck():
    for M, N, K, bias in [(3, 10, 20, True), (1, 7, 16, False), (6, 4, 33, True)]:
        x, w, b = _inputs(M, N, K, bias, seed=3)
        torch.library.opcheck(torch.ops.redrafter.skinny_linear.default, (x, ops.skinny_pack(w), N, b))


def test_registered_for_cpu_only():
    assert ops.CPU_OPS == ("skinny_linear",) and "skinny_linear" not in ops.NATIVE_OPS
    assert ops.skinny_linear is not ref.skinny_linear


@pytest.mark.parametrize("impl", [ops, ref], ids=["native", "reference"])
def test_bad_inputs(impl):
    x, w, b = _inputs(3, 10, 20, True, seed=4)
    p = ops.skinny_pack(w)
    cases = [
        ((x[0], p, 10, b), ValueError, "x"),
        ((x.double(), p, 10, b), TypeError, "x"),
        ((x, p, 13, None), ValueError, "packed must have shape"),
        ((x, p.double(), 10, b), TypeError, "packed"),
        ((x, p[:, :1], 10, b), ValueError, "packed must have shape"),
        ((x, p, -1, b), ValueError, "out_features"),
        ((x, p, 10, b[:9]), ValueError, "bias"),
        ((x, p, 10, b.double()), TypeError, "bias"),
        (("x", p, 10, b), TypeError, "x"),
    ]
    for args, err, what in cases:
        with pytest.raises(err, match=what):
            impl.skinny_linear(*args)


def test_native_launcher_checks_too():
    """Direct ``torch.ops`` calls (no Python checks) get errors naming the argument."""
    x, w, b = _inputs(3, 10, 20, True, seed=5)
    p = ops.skinny_pack(w)
    op = torch.ops.redrafter.skinny_linear
    with pytest.raises(ValueError, match="packed must have shape"):
        op(x, p, 13, None)
    with pytest.raises(TypeError, match="x must be float32"):
        op(x.half(), p, 10, b)
    with pytest.raises(ValueError, match="bias must have shape"):
        op(x, p, 10, b[:3])
    with pytest.raises(ValueError, match="out_features"):
        op(x, p, -4, None)


def test_pack_bad_inputs():
    with pytest.raises(ValueError, match="weight must be a 2-D"):
        ops.skinny_pack(torch.randn(3))
    with pytest.raises(TypeError, match="float32"):
        ops.skinny_pack(torch.randn(3, 4).half())


# ------------------------------------------------------------------------------------------------
# LlamaTarget with packed weights


def _tiny_target():
    torch.manual_seed(0)
    cfg = rx.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    return rx.LlamaTarget(cfg).eval()


def _args(B, T):
    return (torch.randint(0, 97, (B, T), generator=gen(1)), torch.arange(T).expand(B, T),
            torch.tril(torch.ones(T, T, dtype=torch.bool)).expand(B, T, T), torch.zeros(B, dtype=torch.int32))


# 7 x 5 = 35 rows is more than SKINNY_MAX_ROWS: the column-major path, the others the packed one
@pytest.mark.parametrize("B,T", [(1, 1), (1, 7), (3, 4), (7, 5)])
def test_target_packed_same_results(B, T):
    t = _tiny_target()
    with torch.no_grad():
        want = t(*_args(B, T), t.new_kv_cache(B, T))
        t.use_packed_weights().use_column_major_copies()
        got = t(*_args(B, T), t.new_kv_cache(B, T))
    for g_, w_ in zip(got, want):
        torch.testing.assert_close(g_, w_, atol=1e-5, rtol=1e-5)


def test_target_packed_used_and_stale_copies_ignored(monkeypatch):
    t = _tiny_target().use_packed_weights()
    calls = []
    real = torch.ops.redrafter.skinny_linear

    class Spy:
        def __call__(self, *a):
            calls.append(a[0].shape[0])
            return real(*a)

    monkeypatch.setattr(torch.ops.redrafter, "skinny_linear", Spy())
    with torch.no_grad():
        t(*_args(2, 3), t.new_kv_cache(2, 3))
        assert calls and set(calls) == {6}  # every linear of the 6-row forward
        calls.clear()
        assert 8 * 5 > SKINNY_MAX_ROWS
        t(*_args(8, 5), t.new_kv_cache(8, 5))  # 40 rows: more than SKINNY_MAX_ROWS
        assert calls == []
        # after a dtype change the stale float32 copies are ignored, not used
        t.to(torch.bfloat16)
        out16 = t(*_args(2, 3), t.new_kv_cache(2, 3))[0]
        assert calls == [] and out16.isfinite().all()
        t.to(torch.float32)
        t(*_args(2, 3), t.new_kv_cache(2, 3))
        assert calls == []  # the weights were rewritten: the copies are stale until packed again
        t.use_packed_weights()
        t(*_args(2, 3), t.new_kv_cache(2, 3))
        assert calls


def test_target_packed_not_used_where_gradients_are_asked_for(monkeypatch):
    """With gradients asked for, the target runs F.linear (the native op has no backward), so the
    output stays attached to the weights."""
    t = _tiny_target().use_packed_weights()
    calls = []
    real = torch.ops.redrafter.skinny_linear
    monkeypatch.setattr(torch.ops.redrafter, "skinny_linear", lambda *a: calls.append(1) or real(*a))
    logits, _ = t(*_args(1, 3), t.new_kv_cache(1, 3))
    assert calls == [] and logits.requires_grad
    with torch.no_grad():
        t(*_args(1, 3), t.new_kv_cache(1, 3))
    assert calls


@pytest.mark.parametrize("B,W,L", [(1, 1, 4), (1, 4, 5), (3, 2, 3), (7, 3, 2)])
def test_drafter_packed_same_beams(B, W, L):
    """A drafter over packed float32 weights drafts what it does over F.linear (its logits agree to
    float32 rounding; beams equal where no two candidates tie that closely, as with these seeds)."""
    torch.manual_seed(0)
    d = rx.Drafter(rx.DrafterConfig(40, 111, 2, draft_vocab_size=97)).eval()
    d.set_vocab_map(torch.randperm(111)[:97])
    g = gen(3)
    hidden, token, embed = torch.randn(B, 40, generator=g), torch.randint(0, 111, (B,), generator=g), torch.randn(111, 40, generator=g)
    state = torch.randn(B, W, 40, generator=g)
    with torch.no_grad():
        want_logits = d.logits(hidden[:, None], state)
        want = d.beam_search(hidden, token, embed, W, L, ops)
        d.use_packed_weights()
        torch.testing.assert_close(d.logits(hidden[:, None], state), want_logits, atol=1e-5, rtol=1e-5)
        assert torch.equal(d.beam_search(hidden, token, embed, W, L, ops), want)


def test_drafter_packed_used_then_stale(monkeypatch):
    d = rx.Drafter(rx.DrafterConfig(40, 111, 1)).eval().use_packed_weights()
    calls = []
    real = torch.ops.redrafter.skinny_linear
    monkeypatch.setattr(torch.ops.redrafter, "skinny_linear", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    hidden, token, embed = torch.randn(2, 40), torch.tensor([1, 2]), torch.randn(111, 40)
    with torch.no_grad():
        d.beam_search(hidden, token, embed, 3, 3, ops)
        assert set(calls) == {2, 6}  # the first step on beam 0 (B rows), then B*W rows
        calls.clear()
        d.to(torch.bfloat16)  # the float32 copies are stale: F.linear in bf16
        assert d.beam_search(hidden, token, embed, 3, 3, ops).shape == (2, 3, 3) and calls == []


def test_auto_drafter_dtype():
    from redrafter_ext.drafter import auto_dtype

    assert auto_dtype(2) == auto_dtype(32) == torch.float32  # compute-bound above one row
    assert auto_dtype(1) == torch.bfloat16  # one row: the head's GEMV is bound by its bytes
    assert auto_dtype(1, "meta") is None  # off the CPU: the checkpoint's
