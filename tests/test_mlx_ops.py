"""MLX native ops (``redrafter_ext.mlx.ops``) against the pure-PyTorch oracle (``redrafter_ext.reference``).

Same inputs on both sides (converted exactly: bfloat16 through float32). Integer outputs must be
bit-exact; beam_topk scores within float tolerance, its parent/token choice exact. Also: every
logits dtype, int32 and int64 index inputs, non-contiguous and lazy inputs, out-of-range values
(guarded, never out of bounds), kv_compact's donated and copied paths, laziness under mx.compile,
and errors naming the argument.
"""

from __future__ import annotations

import doctest
import itertools

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

import cases  # noqa: E402
import torch  # noqa: E402
from cases import (  # noqa: E402
    beam_inputs,
    follow_tokens,
    gen,
    lookup_cases,
    lookup_inputs,
    ngram_lookup_expected,
    shared_beams,
    trie_beams,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402

from redrafter_ext import reference as ref  # noqa: E402
from redrafter_ext.mlx import ops  # noqa: E402

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def to_mx(t: torch.Tensor) -> mx.array:
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: through float32, exactly
        return mx.array(t.float().numpy()).astype(mx.bfloat16)
    return mx.array(t.contiguous().numpy())


def to_torch(a: mx.array) -> torch.Tensor:
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(a.astype(mx.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def assert_same(got, expected, what=""):
    cases.assert_same([to_torch(a) for a in got], expected, what, "mlx")


# ------------------------------------------------------------------------------------------------
# beam_topk


def check_beam_topk(args, atol=1e-5, layout=lambda a: a):
    *arrays, step = args
    got = ops.beam_topk(*[layout(to_mx(a)) for a in arrays], step)
    exp = ref.beam_topk(*args)
    assert_same(got[1:], exp[1:], "beam_topk")
    assert got[0].dtype == mx.float32
    torch.testing.assert_close(to_torch(got[0]), exp[0], atol=atol, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("B,W", list(itertools.product((1, 3, 7), (1, 2, 8))))
@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk(B, W, dtype):
    for step, (L, D, V) in enumerate([(2, 1, 111), (5, 16, 1000), (8, 3, 5)], start=1):
        step = min(step, L - 1)
        tokens_dtype = (torch.int32, torch.int64)[(B + W) % 2]
        check_beam_topk(beam_inputs(B, W, V, L, D, dtype, step, seed=B * 100 + W + step, tokens_dtype=tokens_dtype))


@pytest.mark.parametrize("B,W,V", [(1, 4, 32000), (2, 2, 128256), (1, 1, 128256)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk_large_vocab(B, W, V, dtype):
    check_beam_topk(beam_inputs(B, W, V, 4, 8, dtype, 2, seed=V + W, state_dtype=torch.float32))


def test_beam_topk_ties_and_nonfinite():
    # exact ties (bf16 rounding) decide by the flat index; NaN/inf rows as torch's log_softmax
    logits, scores, tokens, state, _ = beam_inputs(3, 4, 64, 4, 2, torch.bfloat16, 2, seed=5)
    logits = (logits * 0.1).round().to(torch.bfloat16)  # values in {-1, 0, 1}: many ties
    logits[1, 2, 7] = float("nan")
    logits[2, 0, :] = float("-inf")
    scores[2, 3] = float("-inf")
    check_beam_topk((logits, scores, tokens, state, 2))


def test_beam_topk_layouts():
    # transposed (non-row-contiguous) inputs go through mx.contiguous
    args = beam_inputs(3, 4, 50, 5, 3, torch.float32, 3, seed=7)
    *arrays, step = args
    t = [to_mx(a.transpose(0, 1).contiguous()) for a in arrays]
    got = ops.beam_topk(*[a.swapaxes(0, 1) for a in t], step)
    exp = ref.beam_topk(*args)
    assert_same(got[1:], exp[1:])


# ------------------------------------------------------------------------------------------------
# build_trie, tree_mask


def check_trie(beams: torch.Tensor):
    got = ops.build_trie(to_mx(beams))
    exp = ref.build_trie(beams)
    assert_same(got, exp, "build_trie")
    parent, n = exp[1], exp[4]
    for packed, idx in itertools.product((False, True), (torch.int32, torch.int64)):
        m = ops.tree_mask(to_mx(parent.to(idx)), to_mx(n.to(idx)), packed)
        assert_same([m], [ref.tree_mask(parent, n, packed)], f"tree_mask packed={packed}")
    # the trie's own outputs chained without evaluation
    assert_same([ops.tree_mask(got[1], got[4], True)], [ref.tree_mask(parent, n, True)])


@SETTINGS
@given(shared_beams())
def test_build_trie_hypothesis(beams):
    check_trie(beams)


@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 3, 7), (1, 2, 8, 64), (1, 2, 5))))
def test_build_trie_sizes(B, W, L):
    for beams in trie_beams(B, W, L):
        check_trie(beams)


def test_tree_mask_out_of_range_values_are_guarded():
    # a parent outside [-1, i) makes the node a root; num_nodes is clamped into [0, N]
    parent = torch.tensor([[-1, 0, 5, 1, -7, 3], [-1, 0, 1, 2, 3, 100], [-1, 0, 0, 1, 1, 2]])
    num = torch.tensor([6, 99, -3])
    fixed = parent.clone()
    for i in range(parent.shape[1]):
        bad = (parent[:, i] < -1) | (parent[:, i] >= i)
        fixed[bad, i] = -1
    for packed in (False, True):
        got = ops.tree_mask(to_mx(parent), to_mx(num), packed)
        assert_same([got], [ref.tree_mask(fixed, num.clamp(0, 6), packed)])


def test_reference_guards_tree_values_as_the_kernel_does():
    # the MLX reference is the oracle of these ops: a self-parent, a cycle or a parent past the node
    # makes the node a root there too (values cannot be asserted without a host read)
    from redrafter_ext.mlx import reference as mref

    parent = to_mx(torch.tensor([[-1, 1, 0, 0], [-1, 2, 1, 0], [-1, 0, 3, 2], [-1, 0, 0, -2], [-1, 0, 1, 2]]))
    num = to_mx(torch.tensor([4, 4, 4, 4, 9]))
    for packed in (False, True):
        got, want = mref.tree_mask(parent, num, packed), ops.tree_mask(parent, num, packed)
        np.testing.assert_array_equal(np.array(got), np.array(want))
    for W, L in [(1, 1), (3, 4)]:  # B = 0
        beams = mx.zeros((0, W, L), dtype=mx.int32)
        for a, b in zip(mref.build_trie(beams), ops.build_trie(beams), strict=True):
            assert a.shape == b.shape and a.dtype == b.dtype


# ------------------------------------------------------------------------------------------------
# ngram_lookup


def check_lookup(tokens, length, max_n, m, layout=lambda a: a):
    got = ops.ngram_lookup(layout(to_mx(tokens)), layout(to_mx(length)), max_n, m)
    exp = ref.ngram_lookup(tokens, length, max_n, m)
    assert torch.equal(exp, ngram_lookup_expected(tokens, length, max_n, m))
    assert_same([got], [exp], f"ngram_lookup max_n={max_n} m={m}")
    return exp


@SETTINGS
@given(lookup_inputs())
def test_ngram_lookup_hypothesis(args):
    check_lookup(*args)


@pytest.mark.parametrize("S", (1, 2, 33, 300, 2048))
@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("vocab,dtype", [(3, torch.int32), (3, torch.int64), (32000, torch.int64)])
def test_ngram_lookup_sizes(B, S, vocab, dtype):
    for k, (max_n, m) in enumerate([(1, 1), (2, 4), (3, 9), (4, 5)]):
        tokens, length = lookup_cases(1000 * B + S + k, B, S, vocab, dtype)
        if S >= 33:  # row 0 (length S) ends with a copy of an early span: a long key occurs
            tokens[0, S - 3:] = tokens[0, 1:4].clone()
        exp = check_lookup(tokens, length.to((torch.int32, torch.int64)[k % 2]), max_n, m)
        if S >= 33:
            assert exp[0, 0] >= 0


def test_ngram_lookup_layouts_lengths_and_empty_batch():
    tokens, length = lookup_cases(5, 4, 40, 3, torch.int32)
    # a transposed view and a lazy input go through mx.contiguous
    got = ops.ngram_lookup(to_mx(tokens.T.contiguous()).T, to_mx(length) + 0, 3, 6)
    assert_same([got], [ref.ngram_lookup(tokens, length, 3, 6)])
    # a length outside [0, S] is clamped into it instead of raising
    bad = torch.tensor([-3, 41, 10**6, 0])
    assert_same([ops.ngram_lookup(to_mx(tokens), to_mx(bad), 3, 6)], [ref.ngram_lookup(tokens, bad.clamp(0, 40), 3, 6)])
    out = ops.ngram_lookup(mx.zeros((0, 5), mx.int32), mx.zeros((0,), mx.int32), 2, 3)
    mx.eval(out)
    assert out.shape == (0, 3) and out.dtype == mx.int32
    # lazy, inside mx.compile, with the beam length fixed by m
    f = mx.compile(lambda t, n: ops.ngram_lookup(t, n, 2, 4))
    assert_same([f(to_mx(tokens), to_mx(length))], [ref.ngram_lookup(tokens, length, 2, 4)])


# ------------------------------------------------------------------------------------------------
# verify_greedy, verify_sample


def trie_case(B, W, L, V, dtype, seed, follow=0.7, extra_nodes=0, alphabet=4):
    """Beams with shared prefixes, their trie, and logits whose argmax often follows a child."""
    g = gen(seed)
    beams = torch.randint(0, min(alphabet, V), (B, W, L), generator=g)
    _, _, _, beam_node, _ = ref.build_trie(beams)
    N = 1 + W * (L - 1) + extra_nodes
    logits = torch.randn(B, N, V, generator=g)
    tok = follow_tokens(g, beams, beam_node, N, V, follow)[..., None]
    logits.scatter_(2, tok, logits.gather(2, tok) + 4.0)
    return logits.to(dtype), beams, beam_node


@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 3, 7), (1, 2, 8), (1, 2, 5))))
@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_greedy(B, W, L, dtype):
    V = (111, 7, 1000)[(B + W + L) % 3]
    logits, beams, beam_node = trie_case(B, W, L, V, dtype, seed=B * 100 + W * 10 + L, extra_nodes=L % 2)
    idx = (torch.int32, torch.int64)[(W + L) % 2]
    got = ops.verify_greedy(to_mx(logits), to_mx(beams.to(idx)), to_mx(beam_node))
    assert_same(got, ref.verify_greedy(logits, beams, beam_node), "verify_greedy")


def test_verify_greedy_out_of_range_nodes_are_clamped():
    logits, beams, beam_node = trie_case(3, 4, 4, 20, torch.float32, seed=3)
    bad = beam_node.clone()
    bad[0, 1, 2] = 10**6
    bad[1, 0, 1] = -5
    bad[2, 3, 3] = logits.shape[1]
    got = ops.verify_greedy(to_mx(logits), to_mx(beams), to_mx(bad))
    exp = ref.verify_greedy(logits, beams, bad.clamp(0, logits.shape[1] - 1))
    assert_same(got, exp)


SAMPLE_PARAMS = [(1.0, 0, 1.0), (0.7, 3, 1.0), (1.3, 0, 0.8), (0.5, 5, 0.9), (0.0, 0, 1.0)]


@pytest.mark.parametrize("B,W,L", [(1, 1, 2), (3, 2, 5), (7, 4, 3), (2, 8, 4), (3, 3, 1)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_sample(B, W, L, dtype):
    V = 37
    for k, (temperature, top_k, top_p) in enumerate(SAMPLE_PARAMS):
        seed = B * 1000 + W * 10 + L + k
        logits, beams, beam_node = trie_case(B, W, L, V, dtype, seed=seed, alphabet=3)
        g = gen(seed)
        au = torch.rand(B, L - 1, W, generator=g)
        su = torch.rand(B, generator=g)
        idx = (torch.int32, torch.int64)[k % 2]
        got = ops.verify_sample(
            to_mx(logits), to_mx(beams.to(idx)), to_mx(beam_node), to_mx(au), to_mx(su), temperature, top_k, top_p
        )
        exp = ref.verify_sample(logits, beams, beam_node, au, su, temperature, top_k, top_p)
        assert_same(got, exp, f"verify_sample T={temperature} k={top_k} p={top_p}")


def test_verify_sample_out_of_range_values_are_clamped():
    logits, beams, beam_node = trie_case(2, 3, 4, 11, torch.float32, seed=9, alphabet=3)
    bad_beams, bad_nodes = beams.clone(), beam_node.clone()
    bad_beams[0, 1, 2] = 10**6
    bad_beams[1, 2, 3] = -4
    bad_nodes[1, 0, 2] = 999
    au, su = torch.rand(2, 3, 3, generator=gen(1)), torch.rand(2, generator=gen(2))
    got = ops.verify_sample(to_mx(logits), to_mx(bad_beams), to_mx(bad_nodes), to_mx(au), to_mx(su), 1.0)
    fixed = bad_beams.clone()
    fixed[:, :, 1:] = fixed[:, :, 1:].clamp(0, 10)
    exp = ref.verify_sample(logits, fixed, bad_nodes.clamp(0, logits.shape[1] - 1), au, su, 1.0)
    assert_same(got, exp)


# ------------------------------------------------------------------------------------------------
# kv_compact


def kv_inputs(*args, **kw):
    return cases.kv_inputs(*args, draw_row0=False, **kw)  # this file's cases: row 0's length set, not drawn


def ref_kv(kv, cache_len, path, acc):
    k, c = kv.clone(), cache_len.clone()
    ref.kv_compact(k, c, path, acc)
    return k, c


def buffer_address(a: mx.array) -> int:
    mx.eval(a)
    return np.asarray(a).__array_interface__["data"][0]


@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("L", (1, 2, 5, 8))
@pytest.mark.parametrize("dtype", FLOATS)
def test_kv_compact(B, L, dtype):
    for seed in range(2):
        args = kv_inputs(2, B, 3, 12, 5, L, dtype, seed=seed * 10 + B + L, idx=(torch.int32, torch.int64)[seed])
        exp = ref_kv(*args)
        kv, cache_len = to_mx(args[0]), to_mx(args[1])
        kv_old = np.array(kv.astype(mx.float32))
        got = ops.kv_compact(kv, cache_len, to_mx(args[2]), to_mx(args[3]))
        assert_same(got, exp, "kv_compact")
        # the caller still holds kv: it was copied, not overwritten
        assert np.array_equal(np.array(kv.astype(mx.float32)), kv_old)
        assert to_torch(cache_len).equal(args[1])


def test_kv_compact_donates_its_inputs():
    """Rebinding kv/cache_len to the results lets MLX donate the buffers: compaction in place."""
    kv_t, len_t, path_t, acc_t = kv_inputs(2, 3, 2, 16, 4, 4, torch.float16, seed=3)
    exp = ref_kv(kv_t, len_t, path_t, acc_t)
    kv, cache_len = to_mx(kv_t), to_mx(len_t)
    path, acc = to_mx(path_t), to_mx(acc_t)
    a_kv, a_len = buffer_address(kv), buffer_address(cache_len)
    kv, cache_len = ops.kv_compact(kv, cache_len, path, acc)  # no other reference to the old arrays
    assert buffer_address(kv) == a_kv and buffer_address(cache_len) == a_len
    assert_same([kv, cache_len], exp)
    # a decode loop: the same buffer all along, results right at every step
    for step in range(3):
        kv_t, len_t = exp
        path_t = torch.arange(4).repeat(3, 1) + torch.tensor([[0, 1, 1, 2]])
        acc_t = torch.tensor([step % 4, 1, -1])
        len_t = torch.minimum(len_t, torch.tensor(16 - 6, dtype=torch.int32))
        exp = ref_kv(kv_t, len_t, path_t, acc_t)
        cache_len = to_mx(len_t)
        a_len = buffer_address(cache_len)
        kv, cache_len = ops.kv_compact(kv, cache_len, to_mx(path_t), to_mx(acc_t))
        assert buffer_address(kv) == a_kv and buffer_address(cache_len) == a_len
        assert_same([kv, cache_len], exp, f"step {step}")


def test_kv_compact_copies_when_still_referenced():
    kv_t, len_t, path_t, acc_t = kv_inputs(1, 2, 2, 10, 3, 3, torch.float32, seed=4)
    exp = ref_kv(kv_t, len_t, path_t, acc_t)
    kv, cache_len = to_mx(kv_t), to_mx(len_t)
    a_kv = buffer_address(kv)
    kv2, len2 = ops.kv_compact(kv, cache_len, to_mx(path_t), to_mx(acc_t))
    assert buffer_address(kv2) != a_kv
    assert_same([kv2, len2], exp)
    assert_same([kv, cache_len], [kv_t, len_t])  # the old arrays are intact
    # a lazy (unevaluated, broadcast) input: computed, then compacted
    kv3, len3 = ops.kv_compact(to_mx(kv_t) * 1, cache_len + 0, to_mx(path_t), to_mx(acc_t))
    assert_same([kv3, len3], exp)


def test_kv_compact_invalid_rows_are_left_untouched():
    kv_t, len_t, path_t, acc_t = kv_inputs(2, 5, 2, 8, 2, 4, torch.float32, seed=6, idx=torch.int32)
    acc_t[:] = torch.tensor([2, 5, 1, 1, 2])  # row 1: accept_len > L-1
    path_t[:, :3] = torch.tensor([[0, 1, 2], [0, 1, 2], [0, 0, 2], [0, 3, 2], [0, 1, 2]])  # row 2: path[1] < 1
    len_t[:] = torch.tensor([2, 1, 1, 5, 9], dtype=torch.int32)  # row 3: 5 + 3 >= S; row 4: cache_len > S
    got = ops.kv_compact(to_mx(kv_t), to_mx(len_t), to_mx(path_t), to_mx(acc_t))
    acc_ok, len_ok = acc_t.clone(), len_t.clone()
    acc_ok[1:] = -1
    len_ok[4] = 0  # the reference rejects cache_len > S even on an inactive row
    exp_kv, exp_len = ref_kv(kv_t, len_ok, path_t, acc_ok)
    exp_len[4] = len_t[4]
    assert_same(got, [exp_kv, exp_len])


def test_sliced_inputs_and_empty_batch():
    # evaluated row-contiguous views at an offset into a larger buffer are read in place
    logits, beams, beam_node = trie_case(4, 3, 4, 25, torch.float16, seed=14)
    big = to_mx(torch.cat([logits, logits]))
    mx.eval(big)
    got = ops.verify_greedy(big[5:], to_mx(beams)[1:], to_mx(beam_node)[1:])
    assert_same(got, ref.verify_greedy(logits[1:], beams[1:], beam_node[1:]))
    kv_t, len_t, path_t, acc_t = kv_inputs(3, 2, 2, 9, 3, 3, torch.float32, seed=15)
    kv_all = to_mx(kv_t)
    mx.eval(kv_all)
    got = ops.kv_compact(kv_all[1:], to_mx(len_t), to_mx(path_t), to_mx(acc_t))  # shares kv_all: copied
    assert_same(got, ref_kv(kv_t[1:], len_t, path_t, acc_t))
    assert_same([kv_all], [kv_t])
    # B = 0
    i32 = mx.int32
    outs = [
        *ops.beam_topk(mx.zeros((0, 2, 5)), mx.zeros((0, 2)), mx.zeros((0, 2, 3), i32), mx.zeros((0, 2, 4)), 1),
        *ops.build_trie(mx.zeros((0, 2, 3), i32)),
        ops.tree_mask(mx.zeros((0, 5), i32), mx.zeros((0,), i32)),
        *ops.verify_sample(mx.zeros((0, 5, 7)), mx.zeros((0, 2, 3), i32), mx.zeros((0, 2, 3), i32),
                           mx.zeros((0, 2, 2)), mx.zeros((0,)), 1.0),
        *ops.kv_compact(mx.zeros((2, 2, 0, 3, 8, 4)), mx.zeros((0,), i32), mx.zeros((0, 3), i32), mx.zeros((0,), i32)),
    ]
    mx.eval(*outs)
    assert all(o.size == 0 for o in outs)


# ------------------------------------------------------------------------------------------------
# laziness and transformations


def test_ops_compose_lazily_under_compile():
    """Inside mx.compile any evaluation raises: the ops only build graph nodes."""
    logits, beams, beam_node = trie_case(3, 4, 4, 30, torch.float32, seed=12)
    kv_t, len_t, _, _ = kv_inputs(2, 3, 2, 40, 4, 4, torch.float32, seed=13)
    len_t = len_t.clamp(max=20)  # room for the 13 tree nodes after the prefix

    def step(logits, beams, kv, cache_len):
        _, parent, _, beam_node, n = ops.build_trie(beams)
        mask = ops.tree_mask(parent, n, packed=True)
        acc, best, path, nxt = ops.verify_greedy(logits, beams, beam_node)
        kv, cache_len = ops.kv_compact(kv, cache_len, path, mx.minimum(acc, 3))
        return mask, acc, best, path, nxt, kv, cache_len

    inputs = (to_mx(logits), to_mx(beams), to_mx(kv_t), to_mx(len_t))
    eager = step(*inputs)
    mx.async_eval(eager)  # the CPU tasks run in the background; reading the values waits for them
    compiled = mx.compile(step)(*inputs)
    for a, b in zip(eager, compiled):
        assert mx.array_equal(a, b).item()
    acc, _, path, _ = ref.verify_greedy(logits, beams, beam_node)
    assert_same(compiled[5:], ref_kv(kv_t, len_t, path, acc.clamp(max=3)))


def test_shapeless_compile():
    """output_shapes lets one shapeless compiled graph serve several (B, W, L)."""

    def f(beams, logits):
        _, parent, _, beam_node, n = ops.build_trie(beams)
        return (ops.tree_mask(parent, n, packed=True), *ops.verify_greedy(logits, beams, beam_node))

    cf = mx.compile(f, shapeless=True)
    for B, W, L in [(1, 2, 3), (3, 4, 5), (2, 2, 3)]:
        logits, beams, beam_node = trie_case(B, W, L, 11, torch.float32, seed=B + W + L)
        got = cf(to_mx(beams).astype(mx.int32), to_mx(logits))
        exp_mask = ref.tree_mask(ref.build_trie(beams)[1], ref.build_trie(beams)[4], True)
        assert_same(got, [exp_mask, *ref.verify_greedy(logits, beams, beam_node)], f"B={B} W={W} L={L}")


def test_transforms_are_not_supported():
    beams = to_mx(torch.randint(0, 3, (2, 3, 4), generator=gen(1)))
    with pytest.raises(ValueError, match="vmap"):
        mx.vmap(lambda b: ops.build_trie(b)[1])(mx.stack([beams, beams]))
    logits, scores, tokens, state, step = beam_inputs(1, 2, 9, 3, 2, torch.float32, 1, seed=1)
    with pytest.raises(ValueError, match="vjp"):
        mx.grad(lambda x: ops.beam_topk(x, to_mx(scores), to_mx(tokens), to_mx(state), step)[0].sum())(
            to_mx(logits)
        )


def test_stream_argument():
    beams = to_mx(torch.randint(0, 3, (2, 3, 4), generator=gen(1)))
    assert_same(ops.build_trie(beams, stream=mx.cpu), ref.build_trie(to_torch(beams).long()))
    if not ops.HAS_METAL:  # no Metal kernels: a GPU stream raises (when building or evaluating)
        with pytest.raises((RuntimeError, ValueError)):
            mx.eval(ops.build_trie(beams, stream=mx.gpu)[0])


def test_docstring_examples():
    result = doctest.testmod(ops, extraglobs={"mx": mx}, verbose=False)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------------------------------------
# bad inputs: error type and a message naming the op and the argument


def _good():
    beam = [to_mx(a) for a in beam_inputs(2, 4, 20, 4, 3, torch.float32, 2, seed=20)[:4]] + [2]
    logits, beams, beam_node = trie_case(2, 4, 4, 5, torch.float32, seed=21)
    verify = [to_mx(logits), to_mx(beams), to_mx(beam_node)]
    sample = verify + [mx.zeros((2, 3, 4)), mx.zeros((2,)), 1.0, 0, 1.0]
    kv = [to_mx(a) for a in kv_inputs(2, 2, 2, 10, 4, 4, torch.float32, seed=23)]
    _, parent, _, _, n = ref.build_trie(beams)
    return {
        "beam_topk": beam,
        "build_trie": [verify[1]],
        "tree_mask": [to_mx(parent), to_mx(n)],
        "verify_greedy": verify,
        "verify_sample": sample,
        "kv_compact": kv,
        "ngram_lookup": [mx.zeros((2, 6), dtype=mx.int32), mx.array([6, 3]), 2, 3],
    }


def _bad_cases():
    as_float = lambda a: a.astype(mx.float16)  # noqa: E731  (a float dtype where integers are due)
    cases = [
        ("beam_topk", 0, lambda a: a[0], ValueError, "logits must have 3 dims"),
        ("beam_topk", 0, lambda a: a.astype(mx.int32), TypeError, "logits must have dtype"),
        ("beam_topk", 0, lambda a: np.zeros((2, 4, 20)), TypeError, "logits must be an mlx.core.array"),
        ("beam_topk", 1, lambda a: a[:1], ValueError, "scores must have shape"),
        ("beam_topk", 1, lambda a: a.astype(mx.float16), TypeError, "scores must have dtype"),
        ("beam_topk", 2, as_float, TypeError, "tokens must have dtype"),
        ("beam_topk", 2, lambda a: a[:, :2], ValueError, "tokens must have shape"),
        ("beam_topk", 3, lambda a: a[:1], ValueError, "state must have shape"),
        ("beam_topk", 4, lambda a: 4, ValueError, "step must be"),
        ("beam_topk", 4, lambda a: 0, ValueError, "step must be"),
        ("build_trie", 0, lambda a: a[0], ValueError, "beams must have 3 dims"),
        ("build_trie", 0, as_float, TypeError, "beams must have dtype"),
        ("build_trie", 0, lambda a: a[:, :0], ValueError, "beams must have W >= 1"),
        ("tree_mask", 0, lambda a: a[0], ValueError, "node_parent must have 2 dims"),
        ("tree_mask", 0, as_float, TypeError, "node_parent must have dtype"),
        ("tree_mask", 1, lambda a: a[:1], ValueError, "num_nodes must have shape"),
        ("tree_mask", 1, as_float, TypeError, "num_nodes must have dtype"),
        ("verify_greedy", 0, lambda a: a[:, :5], ValueError, "logits must cover"),
        ("verify_greedy", 0, lambda a: a[:1], ValueError, "logits has batch"),
        ("verify_greedy", 0, lambda a: a.astype(mx.int32), TypeError, "logits must have dtype"),
        ("verify_greedy", 1, as_float, TypeError, "beams must have dtype"),
        ("verify_greedy", 2, lambda a: a[:, :, :2], ValueError, "beam_node must have shape"),
        ("verify_sample", 3, lambda a: a[:, :2], ValueError, "accept_u must have shape"),
        ("verify_sample", 3, lambda a: a.astype(mx.float16), TypeError, "accept_u must have dtype"),
        ("verify_sample", 4, lambda a: a[:1], ValueError, "sample_u must have shape"),
        ("verify_sample", 5, lambda a: -1.0, ValueError, "temperature"),
        ("verify_sample", 5, lambda a: float("inf"), ValueError, "temperature"),
        ("verify_sample", 6, lambda a: -1, ValueError, "top_k"),
        ("verify_sample", 7, lambda a: 0.0, ValueError, "top_p"),
        ("kv_compact", 0, lambda a: a[:, :1], ValueError, "kv dim 1 must be 2"),
        ("kv_compact", 0, lambda a: a[0], ValueError, "kv must have 6 dims"),
        ("kv_compact", 0, lambda a: a.astype(mx.int32), TypeError, "kv must have dtype"),
        ("kv_compact", 1, lambda a: a.astype(mx.int64), TypeError, "cache_len must have dtype"),
        ("kv_compact", 1, lambda a: a[:1], ValueError, "cache_len must have shape"),
        ("kv_compact", 2, lambda a: a[:1], ValueError, "path_nodes must have shape"),
        ("kv_compact", 2, lambda a: mx.zeros((2, 11), dtype=mx.int32), ValueError, "path_nodes length"),
        ("kv_compact", 3, lambda a: a[:1], ValueError, "accept_len must have shape"),
        ("kv_compact", 3, as_float, TypeError, "accept_len must have dtype"),
        ("ngram_lookup", 0, lambda a: a[0], ValueError, "tokens must have 2 dims"),
        ("ngram_lookup", 0, as_float, TypeError, "tokens must have dtype"),
        ("ngram_lookup", 0, lambda a: np.zeros((2, 6)), TypeError, "tokens must be an mlx.core.array"),
        ("ngram_lookup", 0, lambda a: a[:, :0], ValueError, "tokens must have S >= 1"),
        ("ngram_lookup", 1, lambda a: a[:1], ValueError, "length must have shape"),
        ("ngram_lookup", 1, as_float, TypeError, "length must have dtype"),
        ("ngram_lookup", 1, lambda a: a[None], ValueError, "length must have 1 dims"),
        ("ngram_lookup", 2, lambda a: 0, ValueError, "max_n must be an int"),
        ("ngram_lookup", 2, lambda a: 1 << 16, ValueError, "max_n must be an int"),
        ("ngram_lookup", 2, lambda a: 2.0, ValueError, "max_n must be an int"),
        ("ngram_lookup", 3, lambda a: 0, ValueError, "m must be an int"),
        ("ngram_lookup", 3, lambda a: True, ValueError, "m must be an int"),
    ]
    return cases


@pytest.mark.parametrize("op,i,fn,exc,pattern", _bad_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_bad_inputs(op, i, fn, exc, pattern):
    args = _good()[op]
    args[i] = fn(args[i])
    with pytest.raises(exc, match=f"{op}: {pattern}"):
        getattr(ops, op)(*args)


def test_native_layer_checks_too():
    """The C++ op functions check shapes and dtypes themselves (direct _ext calls stay memory-safe)."""
    from redrafter_ext.mlx import _ext

    good = _good()
    with pytest.raises(ValueError, match="beam_topk: tokens must have dtype int32"):
        _ext.beam_topk(*good["beam_topk"][:2], good["beam_topk"][2].astype(mx.int64), *good["beam_topk"][3:])
    with pytest.raises(ValueError, match="verify_greedy: logits must cover"):
        _ext.verify_greedy(good["verify_greedy"][0][:, :3], *[a.astype(mx.int32) for a in good["verify_greedy"][1:]])
    with pytest.raises(ValueError, match="kv_compact: path_nodes length"):
        _ext.kv_compact(*good["kv_compact"][:2], mx.zeros((2, 11), dtype=mx.int32), mx.zeros((2,), dtype=mx.int32))
    with pytest.raises(ValueError, match="tree_mask: num_nodes dim 0"):
        _ext.tree_mask(good["tree_mask"][0], mx.zeros((3,), dtype=mx.int32))
    tokens, length = mx.zeros((2, 6), dtype=mx.int32), mx.zeros((2,), dtype=mx.int32)
    with pytest.raises(ValueError, match="ngram_lookup: tokens must have dtype int32"):
        _ext.ngram_lookup(tokens.astype(mx.int64), length, 2, 3)
    with pytest.raises(ValueError, match="ngram_lookup: length dim 0"):
        _ext.ngram_lookup(tokens, length[:1], 2, 3)
    with pytest.raises(ValueError, match="ngram_lookup: tokens must have S >= 1"):
        _ext.ngram_lookup(tokens[:, :0], length, 2, 3)
    with pytest.raises(ValueError, match=r"ngram_lookup: max_n must be an int in \[1, 65536\)"):
        _ext.ngram_lookup(tokens, length, 0, 3)
    with pytest.raises(ValueError, match=r"ngram_lookup: m must be an int in \[1, 65536\)"):
        _ext.ngram_lookup(tokens, length, 2, 65536)
