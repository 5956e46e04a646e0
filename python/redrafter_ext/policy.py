"""Adaptive speculation: which draft shape (W, L) to run next, from measured cost and acceptance.

Speculation pays when the tokens a step commits outweigh what the bigger step costs. Both sides
move: acceptance with the text and the temperature, step time with the number of active rows
(on a CPU a trie verify turns compute-bound as rows are added; plain decoding stays bound by
reading the weights). A ``SpeculationPolicy`` keeps, for each (W, L) of a small menu that always
includes (1, 1) (plain decoding: no drafter, no trie), two online estimates:

- tokens committed per active row and step (from ``num_out`` and ``steps``, which the loop
  reads at its host reads anyway);
- seconds per step at the current number of active rows (from the wall clock between those
  reads; rows are bucketed by powers of two).

At each read it returns the entry with the highest predicted throughput, ``tokens per row-step *
rows / seconds per step``; an entry with no measurement at the current row bucket is tried first
for one short window (calibration). An entry that is not winning is measured again (acceptance
drifts with the text, and an entry judged on a bad start must get another chance), but only out of
an exploration budget: a re-measurement is expected to lose ``probe`` steps x (its seconds per
step) x (1 - its throughput / the best's), and runs once ``explore`` times the time decoded since
the entry last ran covers that loss. So re-measuring costs at most a fraction ``explore`` of the
time per entry: a near-tie is checked often, for almost nothing, an entry far behind rarely (a fixed
re-try schedule lost 8% of a short sampled run at batch 8 to probes of shapes that never paid).
Decisions happen only at host reads, never inside a step;
switching shape reallocates nothing (``generate`` sizes the cache and the output buffer for the
largest entry once), and every entry runs through the same ``decode_step``, so greedy output stays
identical to plain decoding under any sequence of choices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["DEFAULT_MENU", "PolicyWindows", "SpeculationPolicy"]

# (W, L): plain decoding, two single beams and one small tree (each entry costs a calibration window
# per row bucket, so the menu stays short)
DEFAULT_MENU: tuple[tuple[int, int], ...] = ((1, 1), (1, 4), (1, 8), (2, 4))


def _bucket(rows: int) -> int:
    """Rows rounded up to a power of two: step time is measured and predicted per bucket."""
    return 1 << max(0, int(rows) - 1).bit_length()


@dataclass
class SpeculationPolicy:
    """Chooses (W, L) from ``menu`` by measured throughput (see the module docstring).

    menu       (W, L) pairs, W >= 1, L >= 1; (1, 1) is added when missing
    window     steps between the policy's reads of the rows' progress (its decision points)
    probe      steps of a calibration window (an entry not yet measured at this row bucket)
    explore    the fraction of decoding time that re-measuring entries which are not winning may
               cost, per entry (see the module docstring)
    smoothing  weight of the newest full window in the step-time estimates (0 < smoothing <= 1); a
               shorter window weighs in proportion to its steps, a step time above the estimate a
               quarter as much; acceptance forgets a quarter as fast (about 8 windows at 0.5)

    Estimates are kept per ``context`` (``generate`` passes the sampling options: acceptance
    depends on the temperature) and persist in the object: pass one policy to successive
    ``generate`` calls (or keep one per engine) to calibrate once.
    """

    menu: tuple[tuple[int, int], ...] = DEFAULT_MENU
    window: int = 4
    probe: int = 2
    explore: float = 0.005
    smoothing: float = 0.5
    tokens_per_row_step: dict = field(default_factory=dict)  # (context, entry) -> tokens
    seconds_per_step: dict = field(default_factory=dict)  # (context, entry, row bucket) -> seconds
    _sums: dict = field(default_factory=dict, init=False, repr=False)  # (context, entry) -> (tokens, row-steps)
    _clock: float = field(default=0.0, init=False, repr=False)  # seconds observed, all windows
    _last_run: dict = field(default_factory=dict, init=False, repr=False)  # (context, entry, bucket) -> _clock

    def __post_init__(self) -> None:
        menu = []
        for e in self.menu:
            if (not isinstance(e, (tuple, list)) or len(e) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in e)):
                raise ValueError(f"SpeculationPolicy: menu entries must be (W, L) pairs of ints >= 1, got {e!r}")
            menu.append((int(e[0]), int(e[1])))
        if (1, 1) not in menu:
            menu.insert(0, (1, 1))
        self.menu = tuple(dict.fromkeys(menu))
        for name in ("window", "probe"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"SpeculationPolicy: {name} must be an int >= 1, got {v!r}")
        if isinstance(self.explore, bool) or not isinstance(self.explore, (int, float)) or not 0 <= self.explore <= 1:
            raise ValueError(f"SpeculationPolicy: explore must be in [0, 1], got {self.explore!r}")
        if not 0 < self.smoothing <= 1:
            raise ValueError(f"SpeculationPolicy: smoothing must be in (0, 1], got {self.smoothing!r}")

    @property
    def max_width(self) -> int:
        return max(w for w, _ in self.menu)

    @property
    def max_length(self) -> int:
        return max(length for _, length in self.menu)

    @property
    def max_nodes(self) -> int:
        """The largest trie of the menu, N = 1 + W*(L-1): the cache room every step needs."""
        return max(1 + w * (length - 1) for w, length in self.menu)

    def _ema(self, table: dict, key, value: float, steps: int, up: float) -> None:
        old = table.get(key)
        w = self.smoothing * min(1.0, steps / self.window) * (up if old is not None and value > old else 1.0)
        table[key] = value if old is None else old + w * (value - old)

    def observe(self, entry: tuple[int, int], rows: int, steps: int, seconds: float, tokens: int,
                row_steps: int, context=None) -> None:
        """One window: ``steps`` steps of ``entry`` with ``rows`` active rows at its start took
        ``seconds`` and committed ``tokens`` over ``row_steps`` active row-steps."""
        if steps <= 0 or rows <= 0:
            return
        key = (context, entry, _bucket(rows))
        # other processes only ever slow a step down: a slow window moves the estimate a quarter as
        # much as a fast one, so that entries are compared by what they cost, not by when they ran
        # (on a loaded 2-core machine one entry's windows varied 2x; a plain average followed that)
        self._ema(self.seconds_per_step, key, seconds / steps, steps, up=0.25)
        self._clock += max(0.0, seconds)
        self._last_run[key] = self._clock
        if row_steps > 0:
            # acceptance: a row-step-weighted average over about the entry's last 8 windows. It varies
            # with the text from window to window, and an entry left after a bad window keeps that
            # mark until measured again, so an average that chased each window stranded the best entry
            T, S = self._sums.get((context, entry), (0.0, 0.0))
            keep = 1.0 - 0.25 * self.smoothing * min(1.0, steps / self.window)
            T, S = T * keep + tokens, S * keep + row_steps
            self._sums[(context, entry)] = (T, S)
            self.tokens_per_row_step[(context, entry)] = T / S

    def predicted_throughput(self, entry: tuple[int, int], rows: int, context=None) -> float | None:
        """Predicted tokens per second with ``rows`` active rows, None when not yet measured."""
        t = self.seconds_per_step.get((context, entry, _bucket(rows)))
        a = 1.0 if entry[1] == 1 else self.tokens_per_row_step.get((context, entry))  # L = 1 commits one
        if t is None or a is None:
            return None
        return a * rows / max(t, 1e-9)

    def choose(self, rows: int, context=None) -> tuple[tuple[int, int], int]:
        """The entry to run next with ``rows`` active rows, and for how many steps."""
        bucket = _bucket(rows)
        tps = {}
        for entry in self.menu:
            tp = self.predicted_throughput(entry, rows, context)
            if tp is None:
                return entry, self.probe  # calibration: measure it once at this bucket
            tps[entry] = tp
        best = max(self.menu, key=tps.__getitem__)  # the first of equals: (1, 1) leads the menu
        for entry in self.menu:  # re-measure a loser once the budget since it last ran covers its expected loss
            if entry == best:
                continue
            key = (context, entry, bucket)
            shortfall = 1.0 - tps[entry] / tps[best] if tps[best] > 0 else 0.0
            loss = self.probe * self.seconds_per_step[key] * shortfall
            if (self._clock - self._last_run.get(key, 0.0)) * self.explore > loss:
                return entry, self.probe
        return best, self.window


class PolicyWindows:
    """A loop's bookkeeping around a ``SpeculationPolicy``: what was chosen, from which progress
    counters and when, so that the window's cost and gain can be reported when it ends.

    An engine calling ``decode_step`` itself, at each of its host reads::

        windows = PolicyWindows(policy, context)          # context: e.g. the sampling options
        (W, L), n = windows.choose(active_rows, tokens, row_steps)
        ... n (or fewer) decode_step(..., beam_width=W, beam_length=L) ...
        windows.observe(steps_run, tokens, row_steps)      # counters read after the window

    ``tokens`` and ``row_steps`` are running totals over the batch (``state.num_out.sum()``,
    ``state.steps.sum()``); the wall clock runs from ``choose`` to ``observe``.
    """

    def __init__(self, policy: SpeculationPolicy, context=None) -> None:
        self.policy, self.context = policy, context
        self._open = None  # (entry, rows, tokens, row_steps, t0) of the window in flight

    def choose(self, rows: int, tokens: int, row_steps: int) -> tuple[tuple[int, int], int]:
        """The entry for the next window and its length in steps; starts the window's clock."""
        rows = max(1, int(rows))
        entry, n = self.policy.choose(rows, self.context)
        self._open = (entry, rows, int(tokens), int(row_steps), time.perf_counter())
        return entry, n

    def observe(self, steps: int, tokens: int, row_steps: int) -> None:
        """End the window in flight after ``steps`` steps (a no-op when none is open)."""
        if self._open is None:
            return
        entry, rows, tok0, rs0, t0 = self._open
        self._open = None
        self.policy.observe(entry, rows, steps, time.perf_counter() - t0, int(tokens) - tok0, int(row_steps) - rs0,
                            self.context)
