"""Optional per-stage wall-clock timing of decode steps (for the demo and benchmarks).

Timing a GPU stage needs a device synchronisation at its edges, so it is opt-in: ``decode_step``
takes ``timer=None`` by default and then does no timing work at all.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from contextlib import contextmanager
from types import SimpleNamespace

import torch

# stage names in pipeline order; "draft_rnn" is the drafter's time minus its beam_topk calls
STAGES = ("draft_rnn", "beam_topk", "trie", "verify", "kv_compact", "commit")
_OP_STAGE = {"beam_topk": "beam_topk", "build_trie": "trie", "tree_mask": "trie", "ngram_lookup": "trie", "verify_greedy": "verify",
             "verify_sample": "verify", "kv_compact": "kv_compact", "kv_compact_paged": "kv_compact"}


class _Timed:
    """``obj`` as it is, except that calling it (``method`` None) or its ``method`` is timed under ``name``."""

    def __init__(self, timer: StageTimer, obj, name: str, method: str | None = None) -> None:
        self._timer, self._obj, self._name, self._method = timer, obj, name, method

    def __getattr__(self, attr: str):
        value = getattr(self._obj, attr)
        if attr != self._method:
            return value

        def call(*args, **kwargs):
            with self._timer.section(self._name):
                return value(*args, **kwargs)

        return call

    def __call__(self, *args, **kwargs):
        with self._timer.section(self._name):
            return self._obj(*args, **kwargs)


class StageTimer:
    """Accumulates seconds per stage. ``section(name)`` times a block; ``wrap(ops)`` times op calls;
    ``hooks`` wraps everything a decode step calls, so the step itself carries no timing code."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.seconds: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextmanager
    def section(self, name: str):
        self._sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - t0

    def wrap(self, ops):
        """A stand-in for an ops module whose ops record their time under their stage."""

        def timed(name, fn):
            def call(*args, **kwargs):
                with self.section("op:" + name):
                    return fn(*args, **kwargs)

            return call

        # an ops module may lack kv_compact_paged (decode_step asks for it only on a paged cache)
        return SimpleNamespace(**{n: timed(n, getattr(ops, n)) for n in _OP_STAGE if hasattr(ops, n)})

    def hooks(self, target, drafter, ops):
        """``(target, drafter, ops)`` whose calls record their time: the target's forward under
        "target", the drafter's ``beam_search`` under "draft" (its beam_topk calls under their op),
        every op under "op:<name>"."""
        return _Timed(self, target, "target"), _Timed(self, drafter, "draft", "beam_search"), self.wrap(ops)

    def split(self) -> dict[str, float]:
        """Seconds per stage of ``STAGES``, from the sections of ``hooks`` inside each "step": the
        drafter less its beam_topk calls, the ops by stage, the target's forward with the verify op,
        and "commit" for the rest of the step (gathers, writes, uniforms)."""
        s = self.seconds
        by_stage: dict[str, float] = defaultdict(float)
        for name, stage in _OP_STAGE.items():
            by_stage[stage] += s.get("op:" + name, 0.0)
        split = {
            "draft_rnn": s.get("draft", 0.0) - by_stage["beam_topk"],
            "beam_topk": by_stage["beam_topk"],
            "trie": by_stage["trie"],
            "verify": s.get("target", 0.0) + by_stage["verify"],
            "kv_compact": by_stage["kv_compact"],
        }
        split["commit"] = s.get("step", 0.0) - sum(split.values())
        return split


def cpu_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_name() -> str:
    """The CPU's model name, for a benchmark's header (the same run differs 1.3x between this
    project's machines)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def choose_threads(requested: int | None = None) -> tuple[int, str | None]:
    """Torch CPU threads for timing runs, and a warning when other load competes with them.

    Default (``requested`` None or 0): the cores left free by the 1-minute load average, at least 1.
    Measured on a 2-core machine: with another process busy, 2 torch threads made a small
    generate ~60x slower than 1 (threads wait at every barrier for a core), while on a quiet
    machine 2 threads beat 1 for the 135M target; so use only the cores nobody else is using.
    """
    cores = cpu_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    n = requested if requested else max(1, min(cores, int(cores - load + 0.5)))
    warning = None
    if load > cores - n + 0.5:
        warning = (f"load average {load:.1f} exceeds the {cores - n} core(s) left free by {n} torch thread(s) "
                   f"on {cores} cores: other processes compete, timings will be noisy and speedups unreliable")
    return n, warning


def load_and_threads() -> str:
    """``"load 1.23, 2 threads"`` for figure titles and logs."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"load {load:.2f}, {torch.get_num_threads()} threads"
