"""The CUDA ops on a real GPU: equal to the CPU ops on the same inputs, opcheck, CUDA-graph capture
of ``decode_step``. Skipped without a GPU (the CPU suite proves the same kernels through the
emulator, tests/test_cuda_emulated.py). Run by bench/gpu_check.sh.
"""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from cases import beam_inputs, gen, lookup_cases

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

if torch.cuda.is_available():
    import redrafter_ext.ops as ops
    from redrafter_ext import decode
    from redrafter_ext import reference as ref

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def same(cuda_out, cpu_out, what, float_atol=None):
    cuda_out = cuda_out if isinstance(cuda_out, tuple) else (cuda_out,)
    cpu_out = cpu_out if isinstance(cpu_out, tuple) else (cpu_out,)
    for k, (a, b) in enumerate(zip(cuda_out, cpu_out, strict=True)):
        a = a.cpu()
        assert a.dtype == b.dtype, f"{what} output {k}: dtype {a.dtype} != {b.dtype}"
        if float_atol is not None and a.is_floating_point():
            torch.testing.assert_close(a, b, atol=float_atol, rtol=1e-6, equal_nan=True)
        else:
            assert torch.equal(a, b), f"{what} output {k} differs"


def cuda(args):
    return tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("B,W,V", [(1, 1, 111), (3, 8, 32000), (7, 64, 111), (1, 64, 128256), (256, 4, 32000)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk(B, W, V, dtype):
    for step in (1, 2):
        args = beam_inputs(B, W, V, 4, 16, dtype, step, seed=B + W + V + step)
        got, exp = ops.beam_topk(*cuda(args)), ops.beam_topk(*args)
        same(got[1:], exp[1:], "beam_topk")
        torch.testing.assert_close(got[0].cpu(), exp[0], atol=1e-5, rtol=1e-6, equal_nan=True)


# (2, 96, 128): W*L at the kernel's limit, 156 KB of shared memory (the opt-in above 48 KB)
@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 7, 256), (1, 8, 64), (2, 5, 16))) + [(2, 96, 128)])
def test_build_trie_tree_mask(B, W, L):
    for vocab in (3, 128256):
        beams = torch.randint(0, vocab, (B, W, L), generator=gen(B + W + L))
        got, exp = ops.build_trie(beams.cuda()), ops.build_trie(beams)
        same(got, exp, "build_trie")
        for packed in (False, True):
            same(ops.tree_mask(exp[1].cuda(), exp[4].cuda(), packed), ops.tree_mask(exp[1], exp[4], packed), "mask")


# S past one block of 256 threads (the strided scan), a long history, many rows
@pytest.mark.parametrize("B,S", [(1, 1), (3, 33), (7, 300), (64, 2048), (256, 4096)])
@pytest.mark.parametrize("vocab", [3, 32000])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ngram_lookup(B, S, vocab, dtype):
    tokens, length = lookup_cases(seed=B + S + vocab, B=B, S=S, vocab=vocab, dtype=dtype)
    for max_n, m in [(1, 1), (2, 4), (3, 9), (4, 5)]:
        exp = ref.ngram_lookup(tokens, length, max_n, m)
        same(ops.ngram_lookup(tokens.cuda(), length.cuda(), max_n, m), ops.ngram_lookup(tokens, length, max_n, m),
             "ngram_lookup")
        same(ops.ngram_lookup(tokens.cuda(), length.cuda(), max_n, m), exp, "ngram_lookup vs reference")
    # lengths outside [0, S]: the CUDA kernel clamps them (the CPU op raises)
    bad = torch.tensor([-1, S + 1, -(2**31) + 1, 2**31 - 1] * ((B + 3) // 4), dtype=dtype)[:B]
    same(ops.ngram_lookup(tokens.cuda(), bad.cuda(), 3, 4), ref.ngram_lookup(tokens, bad.clamp(0, S), 3, 4),
         "ngram_lookup, lengths clamped")


@pytest.mark.parametrize("B,W,L,V", [(1, 8, 5, 32000), (7, 64, 5, 111), (3, 4, 16, 128256), (256, 4, 4, 1000)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_greedy(B, W, L, V, dtype):
    beams = torch.randint(0, 4, (B, W, L), generator=gen(W + L))
    _, _, _, beam_node, _ = ref.build_trie(beams)
    N = 1 + W * (L - 1)
    logits = torch.randn(B, N, V, generator=gen(V))
    logits[:, :, :4] += 3.0 * torch.rand(B, N, 4, generator=gen(V + 1))  # the draft tokens often win
    logits = logits.to(dtype)
    same(ops.verify_greedy(logits.cuda(), beams.cuda(), beam_node.cuda()), ops.verify_greedy(logits, beams, beam_node),
         "verify_greedy")


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("D", (1, 3, 64, 128))
def test_kv_compact(dtype, D):
    g = gen(D)
    n_layers, B, H, S, L = 3, 5, 2, 64, 6
    kv = torch.randn(n_layers, 2, B, H, S, D, generator=g).to(dtype)
    acc = torch.tensor([-1, 0, 5, 3, 2])
    path = torch.full((B, L), -1)
    cache_len = torch.tensor([64, 10, 20, 0, 33], dtype=torch.int32)
    for b in range(B):
        for i in range(int(acc[b]) + 1):
            path[b, i] = i + int(torch.randint(0, 20, (), generator=g))
    k1, c1 = kv.cuda(), cache_len.cuda()
    k2, c2 = kv.clone(), cache_len.clone()
    ops.kv_compact(k1, c1, path.cuda(), acc.cuda())
    ops.kv_compact(k2, c2, path, acc)
    assert torch.equal(c1.cpu(), c2) and torch.equal(k1.cpu(), k2)


def test_opcheck_cuda():
    beams = torch.randint(0, 3, (2, 4, 4), generator=gen(11))
    _, parent, _, beam_node, n = ref.build_trie(beams)
    logits = torch.randn(2, 13, 50, generator=gen(12))
    kv = torch.randn(2, 2, 2, 2, 12, 4)
    samples = [
        ("tree_mask", (parent, n, False)), ("tree_mask", (parent, n, True)),
        ("beam_topk", beam_inputs(2, 4, 50, 5, 3, torch.float32, 1, seed=14)),
        ("build_trie", (beams,)), ("verify_greedy", (logits, beams, beam_node)),
        ("verify_sample", (logits, beams, beam_node, torch.rand(2, 3, 4, generator=gen(15)),
                           torch.rand(2, generator=gen(16)), 1.0, 5, 0.9)),
        ("kv_compact", (kv, torch.tensor([0, 3], dtype=torch.int32), torch.tensor([[0, 2, -1, -1], [0, -1, -1, -1]]),
                        torch.tensor([1, 0]))),
        ("ngram_lookup", (torch.randint(0, 3, (3, 40), generator=gen(17)), torch.tensor([40, 7, 0]), 3, 4)),
    ]
    for name, args in samples:
        torch.library.opcheck(getattr(torch.ops.redrafter, name).default, cuda(args))


def test_bad_inputs_cuda():
    with pytest.raises(ValueError, match="beams must have 3 dims"):
        ops.build_trie(torch.zeros(2, 3, dtype=torch.int32, device="cuda"))
    # shapes whose shared memory would not fit a block: a clear error, not a failed launch
    with pytest.raises(ValueError, match=r"tokens \(W\*L\) per row"):
        ops.build_trie(torch.zeros(1, 128, 97, dtype=torch.int32, device="cuda"))
    big = torch.full((1, 40961), -1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="nodes per row"):
        ops.tree_mask(big, torch.ones(1, dtype=torch.int32, device="cuda"), packed=True)
    with pytest.raises(ValueError, match="is on"):
        ops.verify_greedy(torch.zeros(1, 3, 5, device="cuda"), torch.zeros(1, 2, 2, dtype=torch.int32),
                          torch.zeros(1, 2, 2, dtype=torch.int32, device="cuda"))


def _clone_state(s):
    return dataclasses.replace(s, **{f.name: getattr(s, f.name).clone() for f in dataclasses.fields(s)
                                     if isinstance(getattr(s, f.name), torch.Tensor)})


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampling"])
def test_decode_step_cuda_graph(sampled):
    from helpers import random_drafter, random_target

    target = random_target(vocab=97, hidden=64, layers=2).cuda()
    drafter = random_drafter(target).cuda()
    W, L = 4, 4
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    state = decode._start(target, prompts, 24, ref.num_nodes_max(W, L), None, None)
    eager = _clone_state(state)
    step = dict(beam_width=W, beam_length=L, ops=ops)
    graph_step, eager_step = dict(step), dict(step)
    graph = torch.cuda.CUDAGraph()
    if sampled:
        # a graph replays its RNG kernels with the offsets of the capture unless the generator is
        # registered with it: then each replay draws fresh uniforms, as eager steps do
        gens = [torch.Generator(device="cuda").manual_seed(11) for _ in range(2)]
        graph.register_generator_state(gens[0])
        graph_step["sampling"] = decode.SamplingParams(1.0, 20, 0.9, generator=gens[0])
        eager_step["sampling"] = decode.SamplingParams(1.0, 20, 0.9, generator=gens[1])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (allocator, lazy init)
        decode.decode_step(target, drafter, state, **graph_step)
    torch.cuda.current_stream().wait_stream(side)
    decode.decode_step(target, drafter, eager, **eager_step)
    with torch.cuda.graph(graph):
        decode.decode_step(target, drafter, state, **graph_step)
    for _ in range(6):
        graph.replay()
        decode.decode_step(target, drafter, eager, **eager_step)
    torch.cuda.synchronize()
    for name in ("out", "num_out", "cache_len", "token", "done", "steps", "nodes"):
        assert torch.equal(getattr(state, name), getattr(eager, name)), name
    if sampled:
        return
    # and the whole generation equals plain greedy decoding on the GPU
    out = decode.generate(target, drafter, prompts, 24, beam_width=W, beam_length=L, ops=ops)
    ar = decode.autoregressive_generate(target, prompts, 24)
    assert out.tokens == ar.tokens


# ------------------------------------------------------------------------------------------------
# verify_sample: block reductions sum in another order than the reference, so integer outputs are
# compared on the rows whose decisions are >= 1e-9 (relative) from their thresholds (all but ~1e-9
# of them; the margins come from the reference's own probabilities, tests/test_cuda_emulated.py)


def _sample_case(B, W, L, V, seed, dtype, boost):
    g = gen(seed)
    beams = torch.randint(0, 3, (B, W, L), generator=g)
    beams[:, :, 0] = beams[:, :1, 0]
    _, _, _, beam_node, _ = ref.build_trie(beams)
    logits = torch.randn(B, ref.num_nodes_max(W, L), V, generator=g) * 2
    logits[:, :, :3] += boost
    return logits.to(dtype), beams, beam_node, torch.rand(B, L - 1, W, generator=g), torch.rand(B, generator=g)


@pytest.mark.parametrize("B,W,L,V", [(1, 1, 1, 111), (3, 4, 5, 111), (7, 8, 4, 32000), (2, 4, 5, 128256),
                                     (64, 2, 8, 1000)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_sample(B, W, L, V, dtype):
    from test_cuda_emulated import sample_margins

    args = _sample_case(B, W, L, V, seed=B + W + L + V, dtype=dtype, boost=2.0 if V < 1000 else 9.0)
    for t, k, p in [(1.0, 0, 1.0), (0.5, 3, 1.0), (2.0, 0, 0.9), (1.0, 1, 1.0), (0.7, 50, 0.8), (0.0, 0, 1.0)]:
        got = ops.verify_sample(*cuda(args), t, k, p)
        exp = ref.verify_sample(*args, t, k, p)
        safe = sample_margins(*args, t, k, p) >= 1e-9 if t > 0 else torch.ones(B, dtype=torch.bool)
        assert safe.float().mean() >= 0.5
        for a, e in zip(got, exp, strict=True):
            assert a.dtype == torch.int32
            assert torch.equal(a.cpu()[safe], e[safe]), f"T={t} top_k={k} top_p={p}"


def test_verify_sample_statistical():
    import test_sampling as ts

    def verify(logits, beams, beam_node, au, su, t, k, p):
        return tuple(x.cpu() for x in ops.verify_sample(*cuda((logits, beams, beam_node, au, su)), t, k, p))

    for case in [(4, 4, "good", 1.0, 0, 1.0), (4, 3, "bad", 1.0, 0, 0.7), (2, 3, "random", 2.0, 3, 0.9)]:
        stat, dof, pval, _ = ts.run_trials(*case, seed=4242, verify=verify)
        assert pval > 0.01, (case, stat, dof, pval)


def test_verify_sample_guards():
    # out-of-range ids: no error, no out-of-bounds access (compute-sanitizer would see one)
    logits, beams, beam_node, au, su = _sample_case(3, 2, 3, 17, seed=3, dtype=torch.float32, boost=2.0)
    beams[0, :, 1] = 1000
    beam_node[1, :, 0] = 99
    acc, best, path, nxt = (x.cpu() for x in ops.verify_sample(*cuda((logits, beams, beam_node, au, su)), 1.0))
    torch.cuda.synchronize()
    assert int(acc[1]) == 0 and int(nxt[1]) == -1
    assert 0 <= int(nxt[0]) < 17 and 0 <= int(nxt[2]) < 17


def test_generate_sampling_cuda():
    from helpers import random_drafter, random_target

    target = random_target(vocab=97, hidden=64, layers=2).cuda()
    drafter = random_drafter(target).cuda()
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12]]
    opts = dict(beam_width=4, beam_length=4, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    a = decode.generate(target, drafter, prompts, 24, ops=ops, **opts)
    b = decode.generate(target, drafter, prompts, 24, ops=ops, **opts)
    assert a.tokens == b.tokens  # reproducible for a seed
    # the reference on the same uniforms takes the same decisions (up to ~1e-15-close calls)
    r = decode.generate(target, drafter, prompts, 24, ops=ref, **opts)
    assert a.tokens == r.tokens


def test_decode_step_cache_overflow_asserts_on_device():
    # a row without room for the trie fails the stream with a device-side assert (no host sync);
    # the CUDA context is unusable afterwards, so this runs in its own process
    import subprocess
    import sys
    from pathlib import Path

    code = """
import torch
from helpers import random_drafter, random_target
from redrafter_ext import decode, ops
from redrafter_ext import reference as ref
target = random_target(vocab=97, hidden=64, layers=2).cuda()
drafter = random_drafter(target).cuda()
N = ref.num_nodes_max(4, 4)
state = decode._start(target, [[1, 2, 3], [4, 5]], 8, N, None, None)
S = state.kv.shape[4]
state.cache_len[1] = S - N + 1
decode.decode_step(target, drafter, state, beam_width=4, beam_length=4, ops=ops)
torch.cuda.synchronize()
print("NO ERROR")
"""
    tests = Path(__file__).resolve().parent
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tests, timeout=300)
    assert r.returncode != 0 and "NO ERROR" not in r.stdout, r.stdout + r.stderr
    assert "assert" in r.stderr.lower(), r.stderr[-2000:]
