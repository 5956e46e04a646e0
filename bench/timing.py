"""Wall-clock timing shared by the op benchmarks (bench_ops.py, bench_mlx.py); imports no framework."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], setup: Callable[[], object] | None, runs: int,
          budget_s: float = math.inf) -> list[float]:
    """Wall times of ``fn`` (``setup`` runs untimed before each call): ``runs`` of them, or fewer (>= 3)
    when they would take longer than ``budget_s``."""
    if setup:
        setup()
    fn()  # warm-up (thread pool, allocator)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < runs:
        if setup:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 3 and time.perf_counter() - start > budget_s:
            break
    return times


def stats_ms(times: list[float]) -> tuple[float, float]:
    """(median, interquartile range) in milliseconds."""
    ms = sorted(t * 1e3 for t in times)
    if len(ms) < 4:
        return statistics.median(ms), ms[-1] - ms[0]
    q = statistics.quantiles(ms, n=4)
    return statistics.median(ms), q[2] - q[0]
