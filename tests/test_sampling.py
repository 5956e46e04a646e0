"""Exact sampling (``verify_sample``): statistical exactness, greedy limit, native == reference.

The statistical tests use a tiny explicit "target": a table of next-token logits for every prefix
of up to L-1 tokens over a vocabulary of V = 5, so the target's distribution of a whole sequence is
enumerable. One tree-verification step runs on B = 100k rows at once (the ops are batched; every
row is an independent trial with its own uniforms). Each row's committed tokens (accepted drafts +
the sampled next token) are continued to L tokens by sampling from the true table, and the L-token
sequences are compared with the enumerated truth by a chi-square goodness-of-fit test. The
continuation makes the test cover every committed length at once: the procedure is exact iff the
continued sequences follow the target's joint distribution.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from redrafter_ext import reference as ref

V = 5
TRIALS = 100_000
ROOT = 0  # the guaranteed token: the table is conditioned on the tokens after it


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # many small element-wise ops on 100k rows: a second intra-op thread only adds barrier waits
    # (tens of times slower on a shared, busy machine)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# the enumerable target


def prefix_offsets(L: int) -> list[int]:
    """Row of the table where prefixes of each length 0..L-1 start."""
    off, acc = [], 0
    for n in range(L):
        off.append(acc)
        acc += V**n
    return off + [acc]


def prefix_id(tokens: torch.Tensor, n: int, off: list[int]) -> torch.Tensor:
    """Table row of the prefix ``tokens[..., :n]`` (int64)."""
    idx = torch.zeros(tokens.shape[:-1], dtype=torch.int64)
    for i in range(n):
        idx = idx * V + tokens[..., i].long()
    return idx + off[n]


def make_table(L: int, seed: int) -> torch.Tensor:
    """``(rows, V)`` float32 logits: one next-token distribution per prefix of length < L."""
    return (torch.randn(prefix_offsets(L)[-1], V, generator=gen(seed)) * 1.5).float()


def true_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """An independent, row-by-row implementation of the processed distribution (float64)."""
    out = torch.zeros(logits.shape, dtype=torch.float64)
    for r, row in enumerate(logits.double().tolist()):
        x = [v / temperature for v in row]
        if 0 < top_k < V:
            kth = sorted(x, reverse=True)[top_k - 1]
            x = [v if v >= kth else -math.inf for v in x]
        m = max(x)
        e = [math.exp(v - m) for v in x]
        p = [v / sum(e) for v in e]
        if top_p < 1:
            order = sorted(range(V), key=lambda i: (-p[i], i))
            keep, mass = set(), 0.0
            for i in order:
                if mass >= top_p:
                    break
                keep.add(i)
                mass += p[i]
            p = [v if i in keep else 0.0 for i, v in enumerate(p)]
            p = [v / sum(p) for v in p]
        out[r] = torch.tensor(p, dtype=torch.float64)
    return out


def joint_truth(P: torch.Tensor, L: int, n: int | None = None) -> torch.Tensor:
    """``(V**n,)`` probability of every continuation x_1..x_n (default n = L), x_1 most significant."""
    off = prefix_offsets(L)
    n = L if n is None else n
    seqs = torch.tensor(list(itertools.product(range(V), repeat=n)), dtype=torch.int64)
    prob = torch.ones(len(seqs), dtype=torch.float64)
    for j in range(n):
        prob *= P[prefix_id(seqs, j, off), seqs[:, j]]
    return prob


# ------------------------------------------------------------------------------------------------
# drafters: deterministic beams (same for every row) or random per row, never using the uniforms


def beams_good(P: torch.Tensor, W: int, L: int) -> torch.Tensor:
    """The W most likely sequences under the target (likely drafts, shared prefixes)."""
    seqs = torch.tensor(list(itertools.product(range(V), repeat=L - 1)), dtype=torch.int64)
    order = torch.sort(joint_truth(P, L, L - 1), descending=True, stable=True).indices[:W]
    return seqs[order]


def beams_bad(P: torch.Tensor, W: int, L: int) -> torch.Tensor:
    """Unlikely tokens (often outside top-k/top-p: probability 0), with duplicate beams."""
    off = prefix_offsets(L)
    rank = torch.sort(P, dim=1, stable=True).indices  # ascending: rank[:, 0] least likely

    def walk(first_choice: int, last_choice: int) -> list[int]:
        seq: list[int] = []
        for d in range(L - 1):
            row = prefix_id(torch.tensor([seq + [0]]), d, off)[0]
            c = first_choice if d == 0 else (last_choice if d == L - 2 else 0)
            seq.append(int(rank[row, c]))
        return seq

    shapes = [walk(0, 0), walk(0, 0), walk(0, 1), walk(1, 0)]  # beam 1 duplicates beam 0
    return torch.tensor(shapes[:W], dtype=torch.int64)


def make_beams(kind: str, P: torch.Tensor, B: int, W: int, L: int, seed: int) -> torch.Tensor:
    if kind == "random":
        # few distinct tokens so beams share prefixes and repeat; independent of the uniforms
        drafts = torch.randint(0, 3, (B, W, L - 1), generator=gen(seed + 7))
    else:
        drafts = (beams_good if kind == "good" else beams_bad)(P, W, L)[None].expand(B, W, L - 1)
    return torch.cat([torch.full((B, W, 1), ROOT, dtype=torch.int64), drafts], dim=2)


def node_logits(table: torch.Tensor, beams: torch.Tensor, beam_node: torch.Tensor) -> torch.Tensor:
    """``(B, N, V)``: the table row of each node's prefix (padding nodes: zeros)."""
    B, W, L = beams.shape
    off = prefix_offsets(L)
    N = ref.num_nodes_max(W, L)
    out = torch.zeros(B, N, V)
    for d in range(L):
        rows = prefix_id(beams[:, :, 1 : d + 1], d, off)  # [B, W]
        out.scatter_(1, beam_node[:, :, d, None].long().expand(B, W, V), table[rows])
    return out


# ------------------------------------------------------------------------------------------------
# one verification step on every row, continued to L tokens from the truth


def committed(beams, accept_len, best_beam, next_token) -> tuple[torch.Tensor, torch.Tensor]:
    """``(B, L)`` committed tokens x_1.. (accepted drafts then the next token; zeros past) + count."""
    B, W, L = beams.shape
    path = torch.gather(beams, 1, best_beam.long()[:, None, None].expand(B, 1, L))[:, 0, 1:]
    path = torch.cat([path, torch.zeros(B, 1, dtype=path.dtype)], dim=1)
    a = accept_len.long()
    j = torch.arange(L)
    seq = torch.where(j[None] < a[:, None], path, 0)
    seq = torch.where(j[None] == a[:, None], next_token.long()[:, None], seq)
    return seq, a + 1


def continue_from_truth(seq, n_committed, P, L, seed) -> torch.Tensor:
    off = prefix_offsets(L)
    g = gen(seed + 12345)
    seq = seq.clone()
    cdf = P.cumsum(dim=1)
    for j in range(L):
        row = prefix_id(seq, j, off)
        u = torch.rand(seq.shape[0], generator=g, dtype=torch.float64)
        draw = (cdf[row] <= u[:, None] * cdf[row, -1:]).sum(dim=1).clamp(max=V - 1)
        seq[:, j] = torch.where(j >= n_committed, draw, seq[:, j])
    return seq


def chi_square(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int, float]:
    """Pearson chi-square with bins of expected count < 5 pooled; returns (stat, dof, p-value)."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    if small.any() and exp[-1] == 0:
        # bins the truth gives probability 0 must stay empty
        assert obs[-1] == 0, f"{int(obs[-1])} draws of zero-probability sequences"
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(exp) - 1
    pval = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))
    return stat, dof, pval


def naive_verify(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p):
    """Negative control: accept a draft iff u < p(token), per beam independently, longest beam
    wins, the next token from the full p at the stop node. Not exact (it favours drafts)."""
    B, W, L = beams.shape
    p = ref.sampling_probs(logits, temperature, top_k, top_p)
    bn = beam_node.long()
    rows = torch.arange(B)
    acc = torch.zeros(B, W, dtype=torch.int64)
    alive = torch.ones(B, W, dtype=torch.bool)
    for d in range(L - 1):
        pt = p[rows[:, None], bn[:, :, d], beams[:, :, d + 1].long()]  # [B, W]
        ok = alive & (accept_u[:, d, :].double() < pt)
        acc += ok.long()
        alive = ok
    accept_len, best = acc.max(dim=1)
    last = torch.gather(bn, 1, best[:, None, None].expand(B, 1, L))[:, 0].gather(1, accept_len[:, None])[:, 0]
    nxt = ref.sample_inverse_cdf(p[rows, last], sample_u)
    return accept_len.int(), best.int(), None, nxt


def run_trials(W, L, drafter, temperature, top_k, top_p, seed, verify=ref.verify_sample, B=TRIALS):
    table = make_table(L, seed)
    P = true_probs(table, temperature, top_k, top_p)
    beams = make_beams(drafter, P, B, W, L, seed)
    _, _, _, beam_node, _ = ref.build_trie(beams)
    logits = node_logits(table, beams, beam_node)
    g = gen(seed + 1)
    accept_u = torch.rand(B, L - 1, W, generator=g)
    sample_u = torch.rand(B, generator=g)
    accept_len, best, _, nxt = verify(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
    seq, n = committed(beams, accept_len, best, nxt)
    seq = continue_from_truth(seq, n, P, L, seed)
    code = torch.zeros(B, dtype=torch.int64)
    for j in range(L):
        code = code * V + seq[:, j]
    observed = torch.bincount(code, minlength=V**L).double()
    expected = joint_truth(P, L) * B
    stat, dof, pval = chi_square(observed, expected)
    return stat, dof, pval, accept_len.double().mean().item()


# (W, L, drafter, temperature, top_k, top_p): every W, L, drafter and temperature at least twice
CASES = [
    (1, 2, "good", 1.0, 0, 1.0),
    (1, 3, "bad", 0.5, 0, 1.0),
    (1, 4, "good", 2.0, 0, 1.0),
    (2, 2, "bad", 1.0, 0, 1.0),
    (2, 3, "good", 0.5, 3, 1.0),
    (2, 4, "random", 1.0, 0, 0.8),
    (2, 3, "random", 2.0, 3, 0.9),
    (4, 2, "good", 2.0, 0, 1.0),
    (4, 3, "bad", 1.0, 0, 0.7),
    (4, 4, "good", 1.0, 0, 1.0),
    (4, 4, "bad", 2.0, 2, 1.0),
    (4, 3, "random", 0.5, 0, 1.0),
]


def case_id(c):
    W, L, d, t, k, p = c
    return f"W{W}-L{L}-{d}-T{t}" + (f"-k{k}" if k else "") + (f"-p{p}" if p < 1 else "")


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_committed_tokens_follow_target(case):
    W, L, drafter, temperature, top_k, top_p = case
    seed = 1000 + CASES.index(case)
    stat, dof, pval, mean_accept = run_trials(W, L, drafter, temperature, top_k, top_p, seed)
    print(f"{case_id(case)}: chi2={stat:.1f} dof={dof} p={pval:.3f} mean accept={mean_accept:.3f}")
    assert pval > 0.01, f"chi2={stat:.1f} dof={dof} p={pval:.2e}"
    if drafter == "good":
        assert mean_accept > 0.2  # the test exercises accepted paths, not just the fallback


@pytest.mark.parametrize("case", [(1, 2, "good", 1.0, 0, 1.0), (4, 3, "good", 1.0, 0, 1.0),
                                  (2, 3, "random", 0.5, 0, 1.0)], ids=case_id)
def test_naive_per_beam_rule_fails(case):
    # the same harness must reject a plausible but inexact rule
    stat, dof, pval, _ = run_trials(*case, seed=77, verify=naive_verify)
    print(f"naive {case_id(case)}: chi2={stat:.1f} dof={dof} p={pval:.2e}")
    assert pval < 1e-6


MUTANTS = {
    # accept against the unnormalised p(c) instead of p(c) / remaining mass
    "no_renormalisation": ("acc = cand & (u * mass < pt)", "acc = cand & (u < pt)"),
    # after rejections, sample the next token from the full p instead of the residual
    "no_residual": ("resid = torch.where(stop[:, None], q, resid)",
                    "resid = torch.where(stop[:, None], p[rows, cur], resid)"),
}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_subtle_mutants_fail(mutant):
    # power check: one-line mutations of the reference (rewritten from its source) must be caught
    import inspect
    import textwrap

    old, new = MUTANTS[mutant]
    src = textwrap.dedent(inspect.getsource(ref.verify_sample))
    assert old in src, "the reference changed: update MUTANTS"
    ns = dict(vars(ref))
    exec(src.replace(old, new), ns)
    for case in [(4, 3, "good", 1.0, 0, 1.0), (2, 3, "random", 0.5, 0, 1.0)]:
        stat, dof, pval, _ = run_trials(*case, seed=1009, verify=ns["verify_sample"])
        print(f"{mutant} {case_id(case)}: chi2={stat:.1f} dof={dof} p={pval:.2e}")
        assert pval < 1e-3


def test_chi_square_survival_function():
    # known quantiles: P(chi2_1 > 3.841) = 0.05, P(chi2_10 > 23.209) = 0.01
    for stat, dof, p in [(3.841458820694124, 1, 0.05), (23.209251158954356, 10, 0.01)]:
        got = float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64),
                                            torch.tensor(stat / 2.0, dtype=torch.float64)))
        assert abs(got - p) < 1e-9


# ------------------------------------------------------------------------------------------------
# deterministic properties


def random_case(B, W, L, Vr, seed, dtype=torch.float32, n_tokens=3):
    g = gen(seed)
    beams = torch.randint(0, n_tokens, (B, W, L), generator=g)
    beams[:, :, 0] = beams[:, :1, 0]
    _, _, _, beam_node, _ = ref.build_trie(beams)
    logits = (torch.randn(B, ref.num_nodes_max(W, L), Vr, generator=g) * 2).to(dtype)
    logits[:, :, :n_tokens] += 1.5  # drafts are likely enough to be accepted often
    accept_u = torch.rand(B, L - 1, W, generator=g)
    sample_u = torch.rand(B, generator=g)
    return logits, beams, beam_node, accept_u, sample_u


@pytest.mark.parametrize("W,L", [(1, 1), (1, 2), (3, 4), (4, 5)])
def test_temperature_zero_is_greedy(W, L):
    logits, beams, beam_node, au, su = random_case(64, W, L, 11, seed=W * 10 + L)
    got = ref.verify_sample(logits, beams, beam_node, au, su, 0.0, 3, 0.5)
    exp = ref.verify_greedy(logits, beams, beam_node)
    for a, b in zip(got, exp, strict=True):
        assert torch.equal(a, b)


def test_low_temperature_approaches_greedy():
    # T -> 0: the distribution concentrates on the argmax, so every decision becomes the greedy one
    logits, beams, beam_node, au, su = random_case(256, 3, 4, 11, seed=5)
    got = ref.verify_sample(logits, beams, beam_node, au, su, 1e-4)
    exp = ref.verify_greedy(logits, beams, beam_node)
    for a, b in zip(got, exp, strict=True):
        assert torch.equal(a, b)


def test_outputs_are_consistent():
    logits, beams, beam_node, au, su = random_case(512, 4, 4, 7, seed=3)
    accept_len, best, path_nodes, nxt = ref.verify_sample(logits, beams, beam_node, au, su, 1.0, 5, 0.9)
    B, W, L = beams.shape
    assert accept_len.dtype == best.dtype == path_nodes.dtype == nxt.dtype == torch.int32
    assert (accept_len >= 0).all() and (accept_len <= L - 1).all() and accept_len.float().mean() > 0.3
    for b in range(B):
        a, w = int(accept_len[b]), int(best[b])
        assert path_nodes[b, : a + 1].tolist() == beam_node[b, w, : a + 1].tolist()
        assert (path_nodes[b, a + 1 :] == -1).all()
        # the lowest beam through the accepted path
        for v in range(w):
            assert beam_node[b, v, a] != beam_node[b, w, a]
    # the next token is in the kept set of its node (top-k 5 of 7, top-p 0.9)
    p = ref.sampling_probs(logits, 1.0, 5, 0.9)
    last = path_nodes.gather(1, accept_len.long()[:, None])[:, 0]
    assert (p[torch.arange(B), last, nxt.long()] > 0).all()


def test_certain_child_is_always_accepted():
    # top_k=1: p is one-hot, so a draft equal to the argmax is accepted whatever the uniform
    logits, beams, beam_node, au, su = random_case(128, 2, 3, 9, seed=4)
    au = torch.full_like(au, 1 - 2**-24)
    su = torch.full_like(su, 1 - 2**-24)
    got = ref.verify_sample(logits, beams, beam_node, au, su, 1.0, 1, 1.0)
    exp = ref.verify_greedy(logits, beams, beam_node)
    for a, b in zip(got, exp, strict=True):
        assert torch.equal(a, b)


def test_sampling_probs_matches_independent_implementation():
    logits = torch.randn(40, V, generator=gen(9)) * 2
    logits[:3] = torch.tensor([1.0, 1.0, 1.0, 0.0, -1.0])  # ties at the top-k / top-p boundary
    for t, k, p in [(1.0, 0, 1.0), (0.5, 2, 1.0), (2.0, 0, 0.6), (1.0, 3, 0.7), (0.7, 1, 0.3)]:
        torch.testing.assert_close(ref.sampling_probs(logits, t, k, p), true_probs(logits, t, k, p),
                                   rtol=1e-12, atol=1e-14)


def test_reproducible_and_rejects_bad_input():
    args = random_case(16, 2, 3, 7, seed=6)
    a = ref.verify_sample(*args, 1.0)
    b = ref.verify_sample(*args, 1.0)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    logits, beams, beam_node, au, su = args
    with pytest.raises(ValueError, match=r"accept_u must have shape \(B, L-1, W\)"):
        ref.verify_sample(logits, beams, beam_node, au[:, :1], su, 1.0)
    with pytest.raises(TypeError, match="sample_u must have dtype"):
        ref.verify_sample(logits, beams, beam_node, au, su.double(), 1.0)
    with pytest.raises(ValueError, match="temperature"):
        ref.verify_sample(logits, beams, beam_node, au, su, -1.0)
    with pytest.raises(ValueError, match="top_k"):
        ref.verify_sample(logits, beams, beam_node, au, su, 1.0, -2)
    with pytest.raises(ValueError, match="top_p"):
        ref.verify_sample(logits, beams, beam_node, au, su, 1.0, 0, 0.0)
    with pytest.raises(RuntimeError, match=r"\[0, 1\)"):
        ref.verify_sample(logits, beams, beam_node, au + 1, su, 1.0)


def test_native_and_reference_take_the_same_scalars():
    # the schema casts top_k=2.5 to 2 and True to 1: the wrapper must apply the reference's rule first
    import redrafter_ext.ops as ops

    args = random_case(4, 2, 3, 7, seed=7)
    for t, k, p, name in [(1.0, 2.5, 1.0, "top_k"), (1.0, True, 1.0, "top_k"), (1.0, -1, 1.0, "top_k"),
                          (True, 0, 1.0, "temperature"), (float("nan"), 0, 1.0, "temperature"),
                          (float("inf"), 0, 1.0, "temperature"), (1.0, 0, True, "top_p"), (1.0, 0, 1.5, "top_p"),
                          (1.0, 2.0, 1.0, "top_k"), ("1.0", 0, 1.0, "temperature")]:
        for impl in (ops, ref):
            with pytest.raises(ValueError, match=f"verify_sample: {name} must be"):
                impl.verify_sample(*args, t, k, p)
    for t, k, p in [(1, 2, 1), (0.5, 0, 0.9), (0.0, 3, 1.0)]:  # ints are fine where floats are expected
        assert all(torch.equal(a, b) for a, b in zip(ops.verify_sample(*args, t, k, p), ref.verify_sample(*args, t, k, p)))


# ------------------------------------------------------------------------------------------------
# the native kernel equals the reference given the same uniforms

ops = pytest.importorskip("redrafter_ext.ops")

SETTINGS_NATIVE = [
    (1.0, 0, 1.0),
    (0.7, 3, 1.0),
    (1.3, 0, 0.8),
    (2.0, 4, 0.6),
    (0.5, 1, 1.0),
    (0.0, 0, 1.0),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("W,L,Vr", [(1, 1, 5), (1, 3, 7), (3, 4, 11), (4, 5, 6), (8, 3, 300)])
def test_native_equals_reference(dtype, W, L, Vr):
    logits, beams, beam_node, au, su = random_case(96, W, L, Vr, seed=W * 100 + L, dtype=dtype, n_tokens=3)
    for t, k, p in SETTINGS_NATIVE:
        got = ops.verify_sample(logits, beams, beam_node, au, su, t, k, p)
        exp = ref.verify_sample(logits, beams, beam_node, au, su, t, k, p)
        for name, a, b in zip(("accept_len", "best_beam", "path_nodes", "next_token"), got, exp, strict=True):
            assert a.dtype == b.dtype == torch.int32
            assert torch.equal(a, b), f"{name} differs at T={t} top_k={k} top_p={p}"


def test_native_equals_reference_on_statistical_inputs():
    # the 100k-row trials of one tree (shared prefixes, duplicate and zero-probability drafts)
    for case in [(4, 4, "good", 1.0, 0, 1.0), (4, 3, "bad", 1.0, 0, 0.7), (2, 3, "random", 2.0, 3, 0.9)]:
        W, L, drafter, temperature, top_k, top_p = case
        table = make_table(L, 5)
        P = true_probs(table, temperature, top_k, top_p)
        beams = make_beams(drafter, P, 20_000, W, L, 5)
        _, _, _, beam_node, _ = ref.build_trie(beams)
        logits = node_logits(table, beams, beam_node)
        g = gen(6)
        au, su = torch.rand(20_000, L - 1, W, generator=g), torch.rand(20_000, generator=g)
        got = ops.verify_sample(logits, beams.int(), beam_node, au, su, temperature, top_k, top_p)
        exp = ref.verify_sample(logits, beams, beam_node, au, su, temperature, top_k, top_p)
        assert all(torch.equal(a, b) for a, b in zip(got, exp, strict=True)), case_id(case)


def test_native_passes_the_statistical_test():
    stat, dof, pval, _ = run_trials(4, 4, "good", 1.0, 0, 1.0, seed=4242, verify=ops.verify_sample)
    print(f"native W4-L4-good-T1.0: chi2={stat:.1f} dof={dof} p={pval:.3f}")
    assert pval > 0.01


def test_native_rejects_bad_input():
    logits, beams, beam_node, au, su = random_case(4, 2, 3, 7, seed=8)

    def expect(exc, match, *args):
        with pytest.raises(exc, match=match):
            ops.verify_sample(*args)

    expect(ValueError, r"accept_u must have shape \(B, L-1, W\) = \(4, 2, 2\)", logits, beams, beam_node, au[:, :1], su, 1.0)
    expect(TypeError, "sample_u must have dtype float32", logits, beams, beam_node, au, su.double(), 1.0)
    expect(ValueError, r"accept_u\[1, 0, 1\] = 1 is not a uniform", logits, beams, beam_node,
           au.index_put((torch.tensor(1), torch.tensor(0), torch.tensor(1)), torch.tensor(1.0)), su, 1.0)
    expect(ValueError, r"sample_u\[2\] = -0.5", logits, beams, beam_node, au, su.index_put((torch.tensor(2),), torch.tensor(-0.5)), 1.0)
    expect(ValueError, "temperature must be a finite float >= 0", logits, beams, beam_node, au, su, -1.0)
    expect(ValueError, "top_k must be an int >= 0", logits, beams, beam_node, au, su, 1.0, -1)
    expect(ValueError, r"top_p must be a float in \(0, 1\]", logits, beams, beam_node, au, su, 1.0, 0, 1.5)
    bad = beams.clone()
    bad[3, 1, 2] = 7
    expect(ValueError, r"beams\[3, 1, 2\] = 7 is a draft token outside the vocabulary V = 7", logits, bad, beam_node,
           au, su, 1.0)
    bad_node = beam_node.clone()
    bad_node[0, 0, 1] = 99
    expect(ValueError, r"beam_node\[0, 0, 1\] = 99 is outside", logits, beams, bad_node, au, su, 1.0)
    expect(ValueError, "accept_u is on meta", logits, beams, beam_node, au.to("meta"), su, 1.0)


def test_native_fake_kernel_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        logits, beams, beam_node, au, su = (mode.from_tensor(t) for t in random_case(3, 2, 4, 9, seed=1))
        out = ops.verify_sample(logits, beams, beam_node, au, su, 0.8, 2, 0.9)
    assert [tuple(o.shape) for o in out] == [(3,), (3,), (3, 4), (3,)]
    assert all(o.dtype == torch.int32 for o in out)


# ------------------------------------------------------------------------------------------------
# decode_step / generate with sampling

import test_decode  # noqa: E402
from helpers import random_drafter, random_target  # noqa: E402
from test_decode import BACKENDS, NoHostSync, _forbidden  # noqa: E402

import redrafter_ext as rx  # noqa: E402
from redrafter_ext.decode import SamplingParams, _start  # noqa: E402

# the decode tests' prompts and target (a fixture: test functions take it by name)
PROMPTS = test_decode.PROMPTS_3
target = test_decode.target


@pytest.fixture(scope="module")
def greedy_ar(target):
    return rx.autoregressive_generate(target, PROMPTS, 32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.0, 1e-6])
def test_generate_low_temperature_is_greedy(target, greedy_ar, backend, temperature):
    # 1e-6: exp underflows to exactly 0 for any logit gap > 7.5e-4, so sampling is the argmax
    for W, L in [(1, 2), (3, 4)]:
        out = rx.generate(target, random_drafter(target), PROMPTS, 32, beam_width=W, beam_length=L,
                          ops=BACKENDS[backend], temperature=temperature, top_k=5, top_p=0.9, seed=1)
        assert out.tokens == greedy_ar.tokens
    ar = rx.autoregressive_generate(target, PROMPTS, 32, temperature=temperature, seed=2)
    assert ar.tokens == greedy_ar.tokens


def test_generate_sampling_reproducible_and_backend_independent(target, greedy_ar):
    kw = dict(beam_width=3, beam_length=4, temperature=1.0, top_k=20, top_p=0.95)
    a = rx.generate(target, random_drafter(target), PROMPTS, 32, seed=5, **kw)
    b = rx.generate(target, random_drafter(target), PROMPTS, 32, seed=5, ops=ref, **kw)
    c = rx.generate(target, random_drafter(target), PROMPTS, 32, seed=6, **kw)
    assert a.tokens == b.tokens  # native and reference take the same decisions on the same uniforms
    assert a.tokens != c.tokens and a.tokens != greedy_ar.tokens
    assert all(len(t) == 32 for t in a.tokens)
    ar = rx.autoregressive_generate(target, PROMPTS, 32, temperature=1.0, top_k=20, top_p=0.95, seed=5)
    assert ar.tokens == rx.autoregressive_generate(target, PROMPTS, 32, temperature=1.0, top_k=20, top_p=0.95,
                                                   seed=5).tokens


def test_generate_rejects_bad_sampling_options(target):
    d = random_drafter(target)
    for kw, match in [({"temperature": -1.0}, "temperature"), ({"temperature": 1.0, "top_k": -1}, "top_k"),
                      ({"temperature": 1.0, "top_p": 0.0}, "top_p")]:
        with pytest.raises(ValueError, match=match):
            rx.generate(target, d, PROMPTS, 4, **kw)
        with pytest.raises(ValueError, match=match):
            rx.autoregressive_generate(target, PROMPTS, 4, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_with_sampling_never_syncs(target, backend, monkeypatch):
    sampling = SamplingParams(0.8, 10, 0.9, torch.Generator().manual_seed(0))
    state = _start(target, PROMPTS, 16, 13, None, None, sampling)
    drafter = random_drafter(target)
    for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
    with NoHostSync():
        for _ in range(3):
            rx.decode_step(target, drafter, state, beam_width=4, beam_length=4, ops=BACKENDS[backend],
                           sampling=sampling)
    monkeypatch.undo()
    assert int(state.num_out.min()) >= 3


def test_decode_step_explicit_uniforms(target):
    # the uniforms may be passed in: the step is then a deterministic function of them
    sampling = SamplingParams(1.0)
    outs = []
    for _ in range(2):
        state = _start(target, PROMPTS, 8, 13, None, None)
        g = gen(3)
        u = (torch.rand(3, 3, 4, generator=g), torch.rand(3, generator=g))
        rx.decode_step(target, random_drafter(target), state, beam_width=4, beam_length=4, sampling=sampling,
                       uniforms=u)
        outs.append(state.out.clone())
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(ValueError, match="uniforms are only used with sampling"):
        rx.decode_step(target, random_drafter(target), state, beam_width=4, beam_length=4, uniforms=u)


@torch.no_grad()
def joint_first_tokens(tgt, prompt, n, temperature, top_k, top_p):
    """Exact probability of each sequence of the first ``n`` sampled tokens after ``prompt``,
    float64 ``(V**n,)`` indexed by the tokens as base-V digits (first most significant)."""
    Vs = tgt.vocab_size
    truth = torch.ones(1, dtype=torch.float64)
    seqs = torch.zeros(1, 0, dtype=torch.int64)
    for _ in range(n):
        toks = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
        kv = tgt.new_kv_cache(len(seqs), toks.shape[1])
        logits, _ = tgt.prefill(toks, torch.full((len(seqs),), toks.shape[1], dtype=torch.int32), kv)
        p = ref.sampling_probs(logits, temperature, top_k, top_p)  # [S, V]
        truth = (truth[:, None] * p).reshape(-1)
        seqs = torch.cat([seqs.repeat_interleave(Vs, 0), torch.arange(Vs).repeat(len(seqs))[:, None]], dim=1)
    return truth


@pytest.mark.parametrize("method", ["redrafter", "autoregressive"])
def test_generate_first_tokens_follow_target(method):
    # end to end on a model: 20k rows of one prompt, the first 3 generated tokens (the prefill
    # sample, then one or two speculative steps) against the target's enumerated joint distribution
    Vs, B, n, temperature, top_k, top_p = 11, 20_000, 3, 1.0, 8, 0.95
    tgt = random_target(vocab=Vs, hidden=32, layers=1, seed=3)
    prompt = [1, 4, 2, 7]
    truth = joint_first_tokens(tgt, prompt, n, temperature, top_k, top_p)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    if method == "redrafter":
        out = rx.generate(tgt, random_drafter(tgt), [prompt] * B, n, beam_width=3, beam_length=3, **kw)
        assert out.tokens_per_step > 1.05  # speculation really commits several tokens per step
    else:
        out = rx.autoregressive_generate(tgt, [prompt] * B, n, **kw)
    x = torch.tensor(out.tokens)
    code = (x[:, 0] * Vs + x[:, 1]) * Vs + x[:, 2]
    stat, dof, pval = chi_square(torch.bincount(code, minlength=Vs**n).double(), truth * B)
    print(f"{method}: chi2={stat:.1f} dof={dof} p={pval:.3f} tokens/step={out.tokens_per_step:.2f}")
    assert pval > 0.01


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_native_opcheck(temperature):
    # schema, fake kernel and autograd registration agree with the real kernel
    args = random_case(5, 3, 4, 13, seed=2)
    torch.library.opcheck(torch.ops.redrafter.verify_sample.default, (*args, temperature, 4, 0.9))



def test_demo_with_sampling(capsys):
    from redrafter_ext.demo import main

    assert main(["--random-weights", "--prompts", "1", "--max-new-tokens", "8", "--temperature", "0.8",
                 "--top-k", "50", "--top-p", "0.95", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "AR sampling" in out and "tokens/step" in out and "not compared token for token" in out
