"""Modelled global-memory traffic of the CUDA kernels, from the CPU emulator (no GPU needed).

The kernels of verify_greedy, verify_sample and beam_topk load and store global memory through
``ld_global`` / ``st_global`` (csrc/cuda/common.cuh); the emulator (tests/shim/cuda_shim.h) counts
those accesses per launch: bytes by access width and by buffer. For each op and shape this prints
the launches (CTAs each), the modelled bytes (read + write), the minimum bytes the op must move, their
ratio, the passes over the logits, the share of read bytes loaded 16 bytes at a time, and the time
both byte counts imply at 4.3 TB/s (H200), with the launch count (each launch costs ~2-4 us more
outside a CUDA graph).

Minimum bytes: every input the op must read once and every output written once. verify_greedy and
verify_sample: the logits rows of the nodes the walk visits (accepted path + stop node). verify_greedy
is shown with both of its strategies (``greedy/lazy``: argmax depth by depth at the nodes still
reachable, 2L launches; ``greedy/node``: every referenced node at once, 2 launches); ``*`` marks the
one the kernel picks by size.
beam_topk: the logits, scores, tokens and state in, scores, tokens, state and parents out.

Shapes too large to emulate whole are sampled: only every k-th block (by blockIdx.x) runs and its
bytes are scaled by the launch's blocks / blocks run (``sample`` column). Inputs with more than
``--max-random-mb`` of logits are zeros (lazily allocated; the values only change the few bytes of
the acceptance walk), except verify_sample's rows whose blocks run, which get random values (its
top-k / top-p cannot cut a flat row in one pass). Usage: ``python bench/traffic.py [--op beam_topk] [--quick]``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import math
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from redrafter_ext import reference as ref

EMU = Path(__file__).resolve().parents[1] / "tests" / "emu"

HBM = 4.3e12  # bytes/s, H200
KIND16 = {"f32": 0, "f16": 1, "bf16": 2}
ESIZE = {"f32": 4, "f16": 2, "bf16": 2}
SHOW_LAUNCHES = False  # --launches
EMU_BUDGET = 1.2e8  # logits elements emulated per op and shape (about 10-60 s on one core)

BEAM_TOPK = [  # B, W, V, dtype, D (bench/gpu_bench.py, then D=4096, W=64)
    (1, 8, 128256, "bf16", 512), (64, 8, 128256, "bf16", 512), (256, 4, 32000, "f16", 512),
    (4, 64, 128256, "f32", 512), (1, 64, 128256, "bf16", 4096), (64, 64, 128256, "bf16", 4096),
]
VERIFY = [  # B, W, L, V, dtype
    (1, 8, 5, 128256, "bf16"), (64, 8, 5, 128256, "bf16"), (16, 64, 5, 32000, "f16"),
    (1, 64, 5, 128256, "bf16"), (64, 64, 5, 128256, "bf16"),
]
SAMPLE_SETTINGS = [(1.0, 0, 1.0), (0.8, 50, 0.9)]


def emu_build() -> ModuleType:
    """The emulator's builder, ``tests/emu/emu_build.py``: the package ``emu`` imported by its location
    (test tooling, not installed), as the tests import it, without putting a folder on sys.path."""
    if "emu" not in sys.modules:
        spec = importlib.util.spec_from_file_location("emu", EMU / "__init__.py", submodule_search_locations=[str(EMU)])
        sys.modules["emu"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["emu"])
    return importlib.import_module("emu.emu_build")


def logits_array(shape, dtype: str, rng: np.random.Generator, max_random_mb: float) -> np.ndarray:
    """Random logits (N(0, 3^2)) as float32 or 16-bit bits; zeros when larger than max_random_mb."""
    n = math.prod(shape)
    np_dtype = np.float32 if dtype == "f32" else np.uint16
    if n * ESIZE[dtype] > max_random_mb * 1e6:
        return np.zeros(shape, dtype=np_dtype)  # calloc: pages are touched only where read
    V = shape[-1]
    pool = (rng.standard_normal(V + 8192) * 3).astype(np.float32)
    if dtype == "f16":
        pool = pool.astype(np.float16).view(np.uint16)
    elif dtype == "bf16":
        pool = (pool.view(np.uint32) >> 16).astype(np.uint16)
    rows = n // V
    offsets = (np.arange(rows) * 7919) % 8192  # rows are shifted windows of one random pool
    out = np.empty((rows, V), dtype=np_dtype)
    win = np.lib.stride_tricks.sliding_window_view(pool, V)
    for r0 in range(0, rows, 256):
        out[r0 : r0 + 256] = win[offsets[r0 : r0 + 256]]
    return out.reshape(shape)


def aligned(nbytes: int) -> np.ndarray:
    buf = np.zeros(nbytes + 64, dtype=np.uint8)
    off = (-buf.ctypes.data) % 16
    return buf[off : off + nbytes]


def stride_for(elements: int) -> int:
    return max(1, math.ceil(elements / EMU_BUDGET))


def summarise(launches, sizes, min_bytes, stride, label, shape):
    """One table row from the emulator's per-launch counts."""
    total = rd16 = rd = logits_rd = 0.0
    ctas = []
    for ln in launches:
        scale = ln["blocks_total"] / max(1, ln["blocks_run"])
        r = sum(ln["read_by_width"].values()) * scale
        w = sum(ln["write_by_width"].values()) * scale
        total += r + w
        rd += r
        rd16 += ln["read_by_width"].get(16, 0) * scale
        logits_rd += ln["region_read"].get("logits", 0) * scale
        ctas.append(ln["blocks_total"])
    passes = logits_rd / sizes["logits"] if sizes.get("logits") else float("nan")
    t_model, t_min = total / HBM * 1e6, min_bytes / HBM * 1e6
    print(f"{label:13s} {shape:34s} {len(launches):2d} [{','.join(str(c) for c in ctas):>22s}] "
          f"{total / 1e6:10.2f} {min_bytes / 1e6:10.2f} {total / min_bytes:6.2f}x {passes:6.2f} "
          f"{100 * rd16 / max(rd, 1):5.1f}% {t_model:9.2f} {t_min:9.2f}  1/{stride}", flush=True)
    if SHOW_LAUNCHES:
        for ln in launches:
            scale = ln["blocks_total"] / max(1, ln["blocks_run"])
            by = {k: round(v * scale / 1e6, 3) for k, v in {**ln["region_read"]}.items()}
            wr = {k: round(v * scale / 1e6, 3) for k, v in {**ln["region_write"]}.items()}
            print(f"    {ln['name']:28s} grid {ln['blocks_total']:6d}  read MB {by}  write MB {wr}")
    return total, min_bytes


def run_beam_topk(emu, B, W, V, dt, D, rng, args):
    L, step = 5, 2
    logits = logits_array((B, W, V), dt, rng, max(args.max_random_mb, 1100))  # ties would take the exact path
    scores = -np.sort(rng.random((B, W), dtype=np.float32) * 10, axis=1)
    tokens = rng.integers(0, V, (B, W, L), dtype=np.int32)
    sdt = np.float32 if dt == "f32" else np.uint16
    state = rng.integers(0, 2**14, (B, W, D)).astype(sdt)
    outs = (np.zeros((B, W), np.float32), np.zeros((B, W, L), np.int32), np.zeros((B, W, D), sdt),
            np.zeros((B, W), np.int32))
    ws = aligned(emu.beam_topk_workspace_bytes(B, W, V))
    stride = stride_for(B * W * V)
    emu.traffic_start(stride)
    emu.beam_topk(logits, KIND16[dt], scores, tokens, state, step, *outs, ws)
    launches, sizes = emu.traffic_stop()
    es = ESIZE[dt]
    min_bytes = B * W * (V * es + 4 + L * 4 + 2 * D * es + 4 + L * 4 + 4)
    return summarise(launches, sizes, min_bytes, stride, "beam_topk", f"B={B} W={W} V={V} {dt} D={D}")


def verify_inputs(B, W, L, V, dt, rng, args):
    beams = torch.from_numpy(rng.integers(0, 4, (B, W, L), dtype=np.int32))
    beams[:, :, 0] = 0
    beam_node = ref.build_trie(beams)[3]
    N = ref.num_nodes_max(W, L)
    logits = logits_array((B, N, V), dt, rng, args.max_random_mb)
    if logits.any():  # make the drafts likely, so that walks go deep
        boost = np.float32(6.0)
        if dt == "f32":
            logits[:, :, :4] += boost * rng.random((B, N, 4), dtype=np.float32)
        else:
            f = torch.from_numpy(logits[:, :, :4].view(np.int16).copy()).view(getattr(torch, {"f16": "float16", "bf16": "bfloat16"}[dt]))
            f += torch.from_numpy(boost * rng.random((B, N, 4), dtype=np.float32)).to(f.dtype)
            logits[:, :, :4] = f.view(torch.int16).numpy().view(np.uint16)
    used_rows = sum(len(set(beam_node[b].flatten().tolist())) for b in range(B))
    return logits, beams.numpy(), beam_node.to(torch.int32).numpy(), N, used_rows


def run_verify_greedy(emu, B, W, L, V, dt, rng, args):
    """Both strategies (lazy first: its sampled rows' accept_len gives the minimum); auto marked *."""
    logits, beams, beam_node, N, used_rows = verify_inputs(B, W, L, V, dt, rng, args)
    auto_lazy = B * N * V * ESIZE[dt] > L * (16 << 20)  # as use_lazy in csrc/cuda/verify_greedy.cu
    min_bytes = None
    for strategy, name in ((2, "lazy"), (1, "node")):
        outs = (np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros((B, L), np.int32), np.zeros(B, np.int32))
        stride = stride_for(B * V * L * 2) if strategy == 2 else stride_for(B * N * V)
        emu.verify_greedy_set_strategy(strategy)
        emu.traffic_start(stride)
        emu.verify_greedy(logits, KIND16[dt], beams, beam_node, *outs)
        launches, sizes = emu.traffic_stop()
        emu.verify_greedy_set_strategy(0)
        if min_bytes is None:  # the accepted path and the stop node of each row, once
            visited = float((outs[0][np.arange(B) % stride == 0] + 1).mean()) * B
            min_bytes = visited * V * ESIZE[dt] + 2 * B * W * L * 4 + B * (3 + L) * 4
        star = "*" if (strategy == 2) == auto_lazy else " "
        summarise(launches, sizes, min_bytes, stride, f"greedy/{name}{star}", f"B={B} W={W} L={L} V={V} {dt}")


def run_verify_sample(emu, B, W, L, V, dt, setting, rng, args):
    logits, beams, beam_node, N, _ = verify_inputs(B, W, L, V, dt, rng, args)
    t, k, p = setting
    au = rng.random((B, L - 1, W), dtype=np.float32)
    su = rng.random(B, dtype=np.float32)
    outs = (np.zeros(B, np.int32), np.zeros(B, np.int32), np.zeros((B, L), np.int32), np.zeros(B, np.int32))
    ws = np.zeros(B * V, np.float64)
    stride = stride_for(B * V * L * 4)  # a few passes per visited node
    if B * N * V * ESIZE[dt] > args.max_random_mb * 1e6:
        # zero logits are flat rows, which top-k / top-p cannot cut in one pass: random values in
        # the batch rows whose blocks run, sampled sparsely enough to stay within --max-random-mb
        stride = max(stride, math.ceil(B * N * V * ESIZE[dt] / (args.max_random_mb * 1e6)))
        for b in range(0, B, stride):
            logits[b] = verify_inputs(1, W, L, V, dt, rng, args)[0][0]
    emu.traffic_start(stride)
    emu.verify_sample(logits, KIND16[dt], beams, beam_node, au, su, t, k, p, *outs, ws)
    launches, sizes = emu.traffic_stop()
    ran = np.arange(B) % stride == 0  # rows whose block ran: their accept_len is real
    visited = float((outs[0][ran] + 1).mean()) * B
    min_bytes = visited * V * ESIZE[dt] + 2 * B * W * L * 4 + B * (L - 1) * W * 4 + B * 4 + B * (3 + L) * 4
    return summarise(launches, sizes, min_bytes, stride, "verify_sample",
                     f"B={B} W={W} L={L} V={V} {dt} T={t} k={k} p={p}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--op", choices=("beam_topk", "verify_greedy", "verify_sample"), action="append")
    ap.add_argument("--quick", action="store_true", help="B=1 shapes only")
    ap.add_argument("--max-random-mb", type=float, default=600.0)
    ap.add_argument("--launches", action="store_true", help="per launch: bytes read and written per buffer")
    args = ap.parse_args()
    global SHOW_LAUNCHES
    SHOW_LAUNCHES = args.launches
    ops = args.op or ["verify_greedy", "beam_topk", "verify_sample"]
    emu = emu_build().build()
    rng = np.random.default_rng(0)
    print(f"# modelled global traffic (emulator counts), 4.3 TB/s; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'op':13s} {'shape':34s} {'launches [CTAs each]':>27s} {'model MB':>10s} {'min MB':>10s} {'ratio':>7s} "
          f"{'passes':>6s} {'16B rd':>6s} {'t_model us':>9s} {'t_min us':>9s}  sample")
    for op in ops:
        if op == "beam_topk":
            for B, W, V, dt, D in BEAM_TOPK:
                if not (args.quick and B > 1):
                    run_beam_topk(emu, B, W, V, dt, D, rng, args)
        for B, W, L, V, dt in VERIFY:
            if args.quick and B > 1:
                continue
            if op == "verify_greedy":
                run_verify_greedy(emu, B, W, L, V, dt, rng, args)
            elif op == "verify_sample":
                for s in SAMPLE_SETTINGS:
                    run_verify_sample(emu, B, W, L, V, dt, s, rng, args)


if __name__ == "__main__":
    main()
