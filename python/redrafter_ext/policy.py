"""Adaptive speculation: which draft shape (W, L) to run next, from measured cost and acceptance.

A ``SpeculationPolicy`` has a small menu of (W, L) that always includes (1, 1), plain decoding (no
drafter, no trie), and keeps per context and entry two online estimates, updated at the loop's
host reads: tokens committed per active row and step (per bucket of active rows), and the entry's
step time as a ratio to plain decoding's (per bucket of the rows a step computes). At each read it
runs the entry with the highest predicted throughput,

    acceptance * rows / (plain decoding's seconds per step * the entry's cost ratio),

plain decoding unless a drafting entry beats it by ``margin``. An entry not yet measured at the
current buckets runs first, for ``probe`` steps (calibration); an entry that is not winning runs
again for ``probe`` steps once its share of ``explore`` times the time decoded since it last ran
covers the throughput that re-measuring it is expected to lose. Decisions happen only at host
reads; switching shape reallocates nothing and every entry runs through the same ``decode_step``,
so greedy output equals plain decoding under any sequence of choices.

Why each rule, and the measurements behind it: docs/policy.md.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import NamedTuple

from ._scalar_checks import check_int, check_real, is_int
from ._shape_checks import menu_nodes_max

__all__ = ["DEFAULT_MENU", "PolicyWindows", "SpeculationPolicy"]

# (W, L): plain decoding, three single beams and one small tree; short, as each entry costs a
# calibration window per bucket (docs/policy.md: which shape wins where)
DEFAULT_MENU: tuple[tuple[int, int], ...] = ((1, 1), (1, 3), (1, 4), (1, 8), (2, 4))


_AR = (1, 1)


def _chain_tokens(c: float, L: int) -> float:
    """Expected tokens of a step of length L whose drafts are each accepted with probability c given
    their parent was: 1 + c + ... + c^(L-1)."""
    return float(L) if c >= 1.0 else (1.0 - c**L) / (1.0 - c)


@functools.lru_cache(maxsize=256)
def _chain_rate(tokens: float, L: int) -> float:
    """The c in [0, 1] with ``_chain_tokens(c, L) == tokens`` (tokens clamped into [1, L]).
    Cached: ``choose`` asks it for every pair of entries, whose figures change only when observed."""
    if tokens >= L:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(30):  # bisection: _chain_tokens increases with c
        c = 0.5 * (lo + hi)
        lo, hi = (c, hi) if _chain_tokens(c, L) < tokens else (lo, c)
    return 0.5 * (lo + hi)


def _bucket(rows: int) -> int:
    """Rows rounded up to a power of two: step time is measured and predicted per bucket."""
    return 1 << max(0, int(rows) - 1).bit_length()


def _buckets(rows: int, batch: int | None) -> tuple[int, int]:
    """(cost bucket, acceptance bucket): the batch a step computes prices it, the active rows say
    how much of it is progress (``batch`` None: the active rows are the batch)."""
    return _bucket(max(int(rows), int(batch or 0))), _bucket(rows)


@dataclass
class _Cost:
    """One entry's step time at one batch bucket."""

    seconds: float  # seconds per step, a moving average
    ratio: float | None = None  # seconds per step / plain decoding's at this bucket (None: not yet known)
    log_ratios: list[float] = field(default_factory=list)  # the last 7 measured ratios, as logs

    def update(self, t: float, weight: float) -> None:
        """Move ``seconds`` toward this window's ``t`` by ``weight``."""
        # other processes only ever slow a step down: a slow window weighs a quarter
        self.seconds += weight * (0.25 if t > self.seconds else 1.0) * (t - self.seconds)

    def add_ratio(self, value: float) -> None:
        """Record one measured ratio; ``ratio`` becomes the median of the last 7."""
        # the median, not the mean: a pair straddling a change of load is off by that change
        self.log_ratios.append(math.log(max(value, 1e-12)))
        del self.log_ratios[:-7]
        self.ratio = math.exp(statistics.median(self.log_ratios))


@dataclass
class _Entry:
    """What one context has measured of one menu entry."""

    accepted: float | None = None  # tokens per row-step over all row buckets (None: never measured)
    tokens: float = 0.0  # the decayed sums behind ``accepted``
    row_steps: float = 0.0
    # row bucket -> decayed (tokens per row-step x steps, steps)
    by_rows: dict[int, tuple[float, float]] = field(default_factory=dict)
    cost: dict[int, _Cost] = field(default_factory=dict)  # batch bucket -> step time
    # (batch bucket, row bucket) -> the context's clock when this entry's last window there ended
    last_run: dict[tuple[int, int], float] = field(default_factory=dict)

    def accept(self, tokens: int, row_steps: int, steps: int, rbucket: int, keep: float) -> None:
        """Add a window's acceptance after decaying the earlier windows' by ``keep``."""
        self.tokens, self.row_steps = self.tokens * keep + tokens, self.row_steps * keep + row_steps
        self.accepted = self.tokens / self.row_steps
        a, s = self.by_rows.get(rbucket, (0.0, 0.0))
        self.by_rows[rbucket] = (a * keep + tokens / row_steps * steps, s * keep + steps)

    def measured(self, rbucket: int) -> tuple[float, float] | None:
        """(tokens, steps) behind this entry's own acceptance at a row bucket: the bucket's decayed
        sums plus one step at ``accepted``; None when never measured."""
        if self.accepted is None:
            return None
        a, s = self.by_rows.get(rbucket, (0.0, 0.0))
        return a + self.accepted, s + 1.0


@dataclass
class _Context:
    """The estimates of one context (in ``generate``, one sampling setting)."""

    entries: dict[tuple[int, int], _Entry] = field(default_factory=dict)
    # (batch bucket, row bucket) -> seconds decoded there: the exploration budget accrues per bucket
    clock: dict[tuple[int, int], float] = field(default_factory=dict)
    # batch bucket -> (entry, seconds per step) of the last window there
    last_window: dict[int, tuple[tuple[int, int], float]] = field(default_factory=dict)

    def cost(self, entry: tuple[int, int], bucket: int) -> _Cost | None:
        e = self.entries.get(entry)
        return None if e is None else e.cost.get(bucket)

    def measured(self, entry: tuple[int, int], rbucket: int) -> tuple[float, float] | None:
        e = self.entries.get(entry)
        return None if e is None else e.measured(rbucket)


_UNSEEN = _Context()  # what reads find for a context never observed; never written to


@dataclass
class SpeculationPolicy:
    """Chooses (W, L) from ``menu`` by measured throughput (see the module docstring).

    menu       (W, L) pairs, W >= 1, L >= 1; (1, 1) is added when missing
    window     steps between the policy's reads of the rows' progress (its decision points)
    probe      steps of a calibration window (an entry not yet measured at this row bucket)
    margin     how much more throughput than plain decoding a drafting entry must promise to be
               chosen (0.03: 3%)
    explore    the fraction of decoding time that re-measuring the entries which are not winning
               may cost, all together
    smoothing  weight of the newest full window in the step-time estimates (0 < smoothing <= 1); a
               shorter window weighs in proportion to its steps, a step time above the estimate a
               quarter as much; acceptance forgets a tenth as fast (about 20 windows at 0.5)
    prior      steps of weight that an entry's acceptance gives to what the other entries predict
               for it (``chain_prior``); 0: its own measurements alone

    Estimates are kept per ``context`` (``generate`` passes the sampling options: acceptance
    depends on the temperature) and persist in the object: pass one policy to successive
    ``generate`` calls (or keep one per engine) to calibrate once. ``tokens_per_row_step``,
    ``seconds_per_step`` and ``cost_ratio`` show them (copies, as dicts keyed by context first).
    """

    menu: tuple[tuple[int, int], ...] = DEFAULT_MENU
    window: int = 4
    probe: int = 2
    explore: float = 0.005
    margin: float = 0.03
    smoothing: float = 0.5
    prior: float = 16.0
    _contexts: dict = field(default_factory=dict, init=False, repr=False)  # context -> _Context

    def __post_init__(self) -> None:
        op = "SpeculationPolicy"
        menu = []
        for e in self.menu:
            if not isinstance(e, (tuple, list)) or len(e) != 2 or not all(is_int(x) and x >= 1 for x in e):
                raise ValueError(f"{op}: menu entries must be (W, L) pairs of ints >= 1, got {e!r}")
            menu.append((int(e[0]), int(e[1])))
        if _AR not in menu:
            menu.insert(0, _AR)
        self.menu = tuple(dict.fromkeys(menu))
        check_int(op, "window", self.window, 1)
        check_int(op, "probe", self.probe, 1)
        check_real(op, "explore", self.explore, 0, 1)
        check_real(op, "margin", self.margin, 0, 1, hi_open=True)
        check_real(op, "prior", self.prior, 0)
        check_real(op, "smoothing", self.smoothing, 0, 1, lo_open=True)

    @property
    def max_width(self) -> int:
        return max(w for w, _ in self.menu)

    @property
    def max_length(self) -> int:
        return max(length for _, length in self.menu)

    @property
    def max_nodes(self) -> int:
        """The largest trie of the menu, N = 1 + W*(L-1): the cache room every step needs."""
        return menu_nodes_max(self.menu)

    def _entries(self):
        """(context, entry, its _Entry) for everything observed."""
        return ((c, e, s) for c, ctx in self._contexts.items() for e, s in ctx.entries.items())

    @property
    def tokens_per_row_step(self) -> dict:
        """(context, entry) -> tokens committed per row-step, over all row buckets."""
        return {(c, e): s.accepted for c, e, s in self._entries() if s.accepted is not None}

    @property
    def seconds_per_step(self) -> dict:
        """(context, entry, batch bucket) -> seconds per step."""
        return {(c, e, b): cost.seconds for c, e, s in self._entries() for b, cost in s.cost.items()}

    @property
    def cost_ratio(self) -> dict:
        """(context, entry, batch bucket) -> step time / plain decoding's."""
        return {(c, e, b): cost.ratio for c, e, s in self._entries() for b, cost in s.cost.items()
                if cost.ratio is not None}

    def observe(self, entry: tuple[int, int], rows: int, steps: int, seconds: float, tokens: int,
                row_steps: int, context=None, batch: int | None = None) -> None:
        """One window: ``steps`` steps of ``entry`` with ``rows`` active rows at its start, in a
        batch of ``batch`` rows (None: ``rows``), took ``seconds`` and committed ``tokens`` over
        ``row_steps`` active row-steps."""
        if steps <= 0 or rows <= 0:
            return
        bucket, rbucket = _buckets(rows, batch)
        ctx = self._contexts.get(context)
        if ctx is None:
            ctx = self._contexts[context] = _Context()
        stats = ctx.entries.get(entry)
        if stats is None:
            stats = ctx.entries[entry] = _Entry()
        t = seconds / steps
        cost = stats.cost.get(bucket)
        if cost is None:
            stats.cost[bucket] = _Cost(t)
        else:
            cost.update(t, self.smoothing * min(1.0, steps / self.window))
        self._pair(ctx, entry, bucket, t)
        where = (bucket, rbucket)
        clock = ctx.clock[where] = ctx.clock.get(where, 0.0) + max(0.0, seconds)
        stats.last_run[where] = clock
        if row_steps > 0:
            # acceptance varies with the text window to window: it forgets a tenth as fast as step time
            stats.accept(tokens, row_steps, steps, rbucket, 1.0 - 0.1 * self.smoothing * min(1.0, steps / self.window))

    def _pair(self, ctx: _Context, entry: tuple[int, int], bucket: int, t: float) -> None:
        """Cost ratios from this window and the one before it at this bucket (another entry's): other
        processes slow both windows of a pair alike."""
        cost = ctx.entries[entry].cost[bucket]
        prev = ctx.last_window.get(bucket)
        ctx.last_window[bucket] = (entry, t)
        if entry == _AR:
            cost.ratio = 1.0
        if t <= 0:
            return
        if prev is not None and prev[0] != entry and prev[1] > 0:
            before, t_before = prev
            cost_before = ctx.entries[before].cost[bucket]
            if entry != _AR and cost_before.ratio is not None:  # this entry against the one before it
                cost.add_ratio(cost_before.ratio * t / t_before)
            elif before != _AR and cost.ratio is not None:  # the one before against this one
                cost_before.add_ratio(cost.ratio * t_before / t)
        ar = ctx.cost(_AR, bucket)
        if cost.ratio is None and ar is not None and ar.seconds:  # no pair yet: from the absolute times
            cost.add_ratio(t / ar.seconds)

    def _measured(self, entry: tuple[int, int], rbucket: int, context) -> tuple[float, float] | None:
        """(tokens, steps) behind ``entry``'s own acceptance at a row bucket (``_Entry.measured``)."""
        return self._contexts.get(context, _UNSEEN).measured(entry, rbucket)

    def chain_prior(self, entry: tuple[int, int], rows: int, context=None) -> tuple[float, float] | None:
        """(tokens per row-step, steps behind it) that the other drafting entries no wider than
        ``entry`` predict for it: a chain of L - 1 drafts, each accepted with one probability c
        given its parent was, c fitted to each of those entries' measurements, averaged by their
        steps; None when none is measured. With W = 1 a longer draft starts with a shorter one's
        tokens (so it accepts at least as much, and their c agree); a wider beam accepts about as
        much or more, so narrower entries predict it from below."""
        W, L = entry
        rbucket, num, den = _bucket(rows), 0.0, 0.0
        for e in self.menu:
            if e == entry or e[1] == 1 or e[0] > W:
                continue
            m = self._measured(e, rbucket, context)
            if m is not None:
                a = m[0] / m[1]  # extrapolated to L through its c (as it is when the lengths agree)
                num += m[1] * (a if e[1] == L else _chain_tokens(_chain_rate(a, e[1]), L))
                den += m[1]
        return None if den == 0 else (num / den, den)

    def acceptance(self, entry: tuple[int, int], rows: int, context=None) -> float | None:
        """Tokens committed per row-step by ``entry`` with ``rows`` active rows: measured at that row
        bucket, drawn toward the estimate over all buckets by one step's weight and toward
        ``chain_prior`` by ``prior`` steps' weight (at most the steps it rests on), so that one
        unlucky probe cannot dismiss a shape; None when never measured."""
        m = self._measured(entry, _bucket(rows), context)
        if m is None:
            return None
        A, S = m
        prior = self.chain_prior(entry, rows, context) if self.prior > 0 else None
        if prior is None:
            return A / S
        k = min(self.prior, prior[1])  # a prediction weighs no more than the steps it comes from
        return (A + k * prior[0]) / (S + k)

    def predicted_throughput(self, entry: tuple[int, int], rows: int, context=None,
                             batch: int | None = None) -> float | None:
        """Predicted tokens per second with ``rows`` active rows in a batch of ``batch`` (None:
        ``rows``), None when not yet measured."""
        b = _buckets(rows, batch)[0]
        ctx = self._contexts.get(context, _UNSEEN)
        ar, cost = ctx.cost(_AR, b), ctx.cost(entry, b)
        if ar is None or cost is None or cost.ratio is None:
            return None
        a = 1.0 if entry[1] == 1 else self.acceptance(entry, rows, context)  # L = 1 commits one
        return None if a is None else a * rows / max(ar.seconds * cost.ratio, 1e-12)

    def choose(self, rows: int, context=None, batch: int | None = None) -> tuple[tuple[int, int], int]:
        """The entry to run next with ``rows`` active rows in a batch of ``batch`` (None: ``rows``),
        and for how many steps."""
        bucket, rbucket = _buckets(rows, batch)
        tps = {}
        for entry in (_AR, *(e for e in self.menu if e != _AR)):  # plain decoding first: the yardstick
            tp = self.predicted_throughput(entry, rows, context, batch)
            if tp is None:
                return entry, self.probe  # calibration: measure it once at this bucket
            tps[entry] = tp
        # drafting must beat plain decoding by ``margin``: following noisy near ties loses
        score = {e: tp if e == _AR else tp / (1.0 + self.margin) for e, tp in tps.items()}
        best = max(self.menu, key=score.__getitem__)  # the first of equals: (1, 1) leads the menu
        ctx = self._contexts[context]
        t_ar = ctx.entries[_AR].cost[bucket].seconds
        clock = ctx.clock.get((bucket, rbucket), 0.0)
        share = self.explore / max(1, len(self.menu) - 1)  # the budget, split among the losers
        for entry in self.menu:  # re-measure a loser once the budget since it last ran covers its expected loss
            if entry == best:
                continue
            stats = ctx.entries[entry]
            shortfall = 1.0 - score[entry] / score[best] if score[best] > 0 else 0.0
            loss = self.probe * t_ar * stats.cost[bucket].ratio * shortfall
            if (clock - stats.last_run.get((bucket, rbucket), 0.0)) * share > loss:
                return entry, self.probe
        return best, self.window


class _Window(NamedTuple):
    """A window in flight: what ``PolicyWindows.choose`` chose, and the counters and clock it started from."""

    entry: tuple[int, int]
    rows: int
    batch: int | None
    tokens: int
    row_steps: int
    laggard: int | None
    t0: float


class PolicyWindows:
    """A loop's bookkeeping around a ``SpeculationPolicy``: what was chosen, from which progress
    counters and when, so that the window's cost and gain can be reported when it ends.

    An engine calling ``decode_step`` itself, at each of its host reads::

        windows = PolicyWindows(policy, context)          # context: e.g. the sampling options
        (W, L), n = windows.choose(active_rows, tokens, row_steps)  # batch=: rows a step computes
        ... n (or fewer) decode_step(..., beam_width=W, beam_length=L) ...
        windows.observe(steps_run, tokens, row_steps)      # counters read after the window

    ``tokens`` and ``row_steps`` are running totals over the batch (``state.num_out.sum()``,
    ``state.steps.sum()``); the wall clock runs from ``choose`` to ``observe``. A batch that runs
    until its last row is done (``generate``: nothing refills finished rows) takes as long as its
    slowest row: pass ``laggard`` (the fewest tokens an active row has written) to both calls and a
    window is judged by that row's progress per step instead of the mean row's. Such a batch also
    keeps computing its finished rows: pass ``batch`` (the rows a step computes) so that step time
    is looked up for that batch, not for the rows still active. A server that refills rows leaves
    out ``laggard``; one that drops finished rows from its steps leaves out ``batch``.
    """

    def __init__(self, policy: SpeculationPolicy, context=None) -> None:
        self.policy, self.context = policy, context
        self._open: _Window | None = None

    def choose(self, rows: int, tokens: int, row_steps: int, laggard: int | None = None,
               batch: int | None = None) -> tuple[tuple[int, int], int]:
        """The entry for the next window and its length in steps; starts the window's clock."""
        rows = max(1, int(rows))
        entry, n = self.policy.choose(rows, self.context, batch)
        self._open = _Window(entry, rows, batch, int(tokens), int(row_steps), laggard, time.perf_counter())
        return entry, n

    def observe(self, steps: int, tokens: int, row_steps: int, laggard: int | None = None) -> None:
        """End the window in flight after ``steps`` steps (a no-op when none is open)."""
        w, self._open = self._open, None
        if w is None:
            return
        seconds = time.perf_counter() - w.t0
        if w.laggard is not None and laggard is not None:
            # the slowest row's tokens per step (a step commits at most L; a laggard stopped by EOS
            # hands the title to the next row, whose count may be higher: capped there)
            gain = max(0, min(int(laggard) - int(w.laggard), steps * w.entry[1]))
            self.policy.observe(w.entry, w.rows, steps, seconds, gain, steps, self.context, w.batch)
        else:
            self.policy.observe(w.entry, w.rows, steps, seconds, int(tokens) - w.tokens, int(row_steps) - w.row_steps,
                                self.context, w.batch)
