"""Adaptive speculation: which draft shape (W, L) to run next, from measured cost and acceptance.

Speculation pays when the tokens a step commits outweigh what the bigger step costs. Both sides
move: acceptance with the text and the temperature, step time with the number of active rows
(on a CPU a trie verify turns compute-bound as rows are added; plain decoding stays bound by
reading the weights). A ``SpeculationPolicy`` keeps, for each (W, L) of a small menu that always
includes (1, 1) (plain decoding: no drafter, no trie), two online estimates:

- tokens committed per active row and step (from ``num_out`` and ``steps``, which the loop
  reads at its host reads anyway), per row bucket, drawn slightly toward all buckets' figure and
  toward what the other drafting entries predict for it (a chain of drafts each accepted with a
  fitted probability), so that a short, unlucky window cannot dismiss a shape;
- seconds per step at the current batch (the rows a step computes, bucketed by powers of two:
  ``generate`` keeps finished rows in its fixed-shape batch, so a batch of 8 with 2 rows left
  costs what 8 rows cost; a server that drops finished rows passes its active rows), and each
  entry's step time relative to plain decoding's, measured across consecutive windows of two
  entries: other processes slow both alike, so the ratio holds where the absolute times of
  windows run minutes apart do not.

At each read it returns the entry with the highest predicted throughput, ``tokens per row-step *
rows / (plain decoding's seconds per step * the entry's cost ratio)``, plain decoding unless a
drafting entry beats it by ``margin``; an entry with no measurement at the current batch bucket is
tried first for one short window (calibration). An entry that is not winning is measured again (acceptance
drifts with the text, and an entry judged on a bad start must get another chance), but only out of
an exploration budget: a re-measurement is expected to lose ``probe`` steps x (its seconds per
step) x (1 - its throughput / the best's), and runs once its share of ``explore`` (split evenly
among the entries that are not winning) times the time decoded since the entry last ran (at the
current batch and row buckets) covers that loss. So re-measuring costs about a fraction ``explore``
of the time, all entries together: a near-tie is checked often, for almost nothing, an entry far
behind rarely (a fixed re-try schedule lost 8% of a short sampled run at batch 8 to probes of
shapes that never paid; a budget of 0.5% per entry cost the small model ~4% at T = 0.7, where
plain decoding wins and every probe loses, as a probe also pays for the switch into and out of it).
Decisions happen only at host reads, never inside a step;
switching shape reallocates nothing (``generate`` sizes the cache and the output buffer for the
largest entry once), and every entry runs through the same ``decode_step``, so greedy output stays
identical to plain decoding under any sequence of choices.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import dataclass, field

from ._scalar_checks import check_int, check_real, is_int

__all__ = ["DEFAULT_MENU", "PolicyWindows", "SpeculationPolicy"]

# (W, L): plain decoding, three single beams and one small tree (each entry costs a calibration
# window per row bucket, so the menu stays short). 1x3 is the best shape on SmolLM2 (its drafter
# accepts ~0.5 tokens per draft step), 1x8 on the shipped tiny model (~0.9).
DEFAULT_MENU: tuple[tuple[int, int], ...] = ((1, 1), (1, 3), (1, 4), (1, 8), (2, 4))


_AR = (1, 1)


def _chain_tokens(c: float, L: int) -> float:
    """Expected tokens of a step of length L whose drafts are each accepted with probability c given
    their parent was: 1 + c + ... + c^(L-1)."""
    return float(L) if c >= 1.0 else (1.0 - c**L) / (1.0 - c)


@functools.lru_cache(maxsize=256)
def _chain_rate(tokens: float, L: int) -> float:
    """The c in [0, 1] with ``_chain_tokens(c, L) == tokens`` (tokens clamped into [1, L]).
    Cached: each ``choose`` asks it for every pair of entries, and an entry's figure only changes
    when that entry is observed."""
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
class SpeculationPolicy:
    """Chooses (W, L) from ``menu`` by measured throughput (see the module docstring).

    menu       (W, L) pairs, W >= 1, L >= 1; (1, 1) is added when missing
    window     steps between the policy's reads of the rows' progress (its decision points)
    probe      steps of a calibration window (an entry not yet measured at this row bucket)
    margin     how much more throughput than plain decoding a drafting entry must promise to be
               chosen (0.03: 3%)
    explore    the fraction of decoding time that re-measuring the entries which are not winning
               may cost, all together (see the module docstring)
    smoothing  weight of the newest full window in the step-time estimates (0 < smoothing <= 1); a
               shorter window weighs in proportion to its steps, a step time above the estimate a
               quarter as much; acceptance forgets a tenth as fast (about 20 windows at 0.5)
    prior      steps of weight that an entry's acceptance gives to what the other entries predict
               for it (``chain_prior``); 0: its own measurements alone

    Estimates are kept per ``context`` (``generate`` passes the sampling options: acceptance
    depends on the temperature) and persist in the object: pass one policy to successive
    ``generate`` calls (or keep one per engine) to calibrate once.
    """

    menu: tuple[tuple[int, int], ...] = DEFAULT_MENU
    window: int = 4
    probe: int = 2
    explore: float = 0.005
    margin: float = 0.03
    smoothing: float = 0.5
    prior: float = 16.0
    tokens_per_row_step: dict = field(default_factory=dict)  # (context, entry) -> tokens, all row buckets
    seconds_per_step: dict = field(default_factory=dict)  # (context, entry, batch bucket) -> seconds
    cost_ratio: dict = field(default_factory=dict)  # (context, entry, batch bucket) -> step time / (1, 1)'s
    _prev: dict = field(default_factory=dict, init=False, repr=False)  # (context, batch bucket) -> last window
    _ratio_hist: dict = field(default_factory=dict, init=False, repr=False)  # key -> recent log ratios
    _sums: dict = field(default_factory=dict, init=False, repr=False)  # (context, entry) -> (tokens, row-steps)
    # (context, entry, row bucket) -> (tokens/row-step x steps, steps)
    _bucket_sums: dict = field(default_factory=dict, init=False, repr=False)
    # (context, batch bucket, row bucket) -> seconds observed; (context, entry, buckets) -> _clock at its last run
    _clock: dict = field(default_factory=dict, init=False, repr=False)
    _last_run: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        op = "SpeculationPolicy"
        menu = []
        for e in self.menu:
            if not isinstance(e, (tuple, list)) or len(e) != 2 or not all(is_int(x) and x >= 1 for x in e):
                raise ValueError(f"{op}: menu entries must be (W, L) pairs of ints >= 1, got {e!r}")
            menu.append((int(e[0]), int(e[1])))
        if (1, 1) not in menu:
            menu.insert(0, (1, 1))
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
        return max(1 + w * (length - 1) for w, length in self.menu)

    def _ema(self, table: dict, key, value: float, steps: int, up: float) -> None:
        old = table.get(key)
        w = self.smoothing * min(1.0, steps / self.window) * (up if old is not None and value > old else 1.0)
        table[key] = value if old is None else old + w * (value - old)

    def observe(self, entry: tuple[int, int], rows: int, steps: int, seconds: float, tokens: int,
                row_steps: int, context=None, batch: int | None = None) -> None:
        """One window: ``steps`` steps of ``entry`` with ``rows`` active rows at its start, in a
        batch of ``batch`` rows (None: ``rows``), took ``seconds`` and committed ``tokens`` over
        ``row_steps`` active row-steps."""
        if steps <= 0 or rows <= 0:
            return
        bucket, rbucket = _buckets(rows, batch)
        key = (context, entry, bucket)
        # other processes only ever slow a step down: a slow window moves the estimate a quarter as
        # much as a fast one, so that entries are compared by what they cost, not by when they ran
        # (on a loaded 2-core machine one entry's windows varied 2x; a plain average followed that)
        self._ema(self.seconds_per_step, key, seconds / steps, steps, up=0.25)
        self._pair(context, entry, bucket, seconds / steps, steps)
        # the exploration budget accrues per batch and row bucket: a batch that visits 8 rows for a
        # few steps now and then must not spend there a budget earned at 1 row (the small model's
        # 8-row runs of ~15 steps re-measured every entry each time, 6 of those steps)
        where = (context, bucket, rbucket)
        clock = self._clock[where] = self._clock.get(where, 0.0) + max(0.0, seconds)
        self._last_run[(context, entry, bucket, rbucket)] = clock
        if row_steps > 0:
            # acceptance: a row-step-weighted average over about the entry's last 20 windows. It varies
            # with the text from window to window, and an entry left after a bad window keeps that
            # mark until measured again, so an average that chased each window stranded the best entry
            # (over 8 windows, SmolLM2 at one row drifted below the margin by chance after two rounds and
            # then decoded plainly, 0.93x 1x3; simulated over 40 seeds, median 0.98x the best with 20, 0.96x with 8)
            T, S = self._sums.get((context, entry), (0.0, 0.0))
            keep = 1.0 - 0.1 * self.smoothing * min(1.0, steps / self.window)
            T, S = T * keep + tokens, S * keep + row_steps
            self._sums[(context, entry)] = (T, S)
            self.tokens_per_row_step[(context, entry)] = T / S
            # and per row bucket: judged by its slowest row (``PolicyWindows(laggard=)``) a batch of 8
            # gains less per step than one row, and more so for long drafts; a pooled estimate kept
            # the 1-row figure for shapes that had not run lately and picked them at 8 rows
            akey = (context, entry, rbucket)
            A, S = self._bucket_sums.get(akey, (0.0, 0.0))
            self._bucket_sums[akey] = (A * keep + tokens / row_steps * steps, S * keep + steps)

    def _pair(self, context, entry: tuple[int, int], bucket: int, t: float, steps: int) -> None:
        """Cost ratios from this window and the one before it at this bucket (another entry's)."""
        ratios, key = self.cost_ratio, (context, entry, bucket)
        prev = self._prev.get((context, bucket))
        self._prev[(context, bucket)] = (entry, t, steps)
        if entry == _AR:
            ratios[key] = 1.0
        if t <= 0:
            return
        if prev is not None and prev[0] != entry and prev[1] > 0:
            f, tf, _ = prev
            fkey = (context, f, bucket)
            if entry != _AR and fkey in ratios:  # this entry against the one before it
                self._add_ratio(key, ratios[fkey] * t / tf)
            elif f != _AR and key in ratios:  # the one before against this one
                self._add_ratio(fkey, ratios[key] * tf / t)
        t_ar = self.seconds_per_step.get((context, _AR, bucket))
        if key not in ratios and t_ar:  # no pair yet: from the absolute times
            self._add_ratio(key, t / t_ar)

    def _add_ratio(self, key, value: float) -> None:
        # the median of the last 7 pairs: a pair straddling a change of load is off by that change,
        # and an average kept that error until enough pairs diluted it (pairs come only at switches)
        hist = self._ratio_hist.setdefault(key, [])
        hist.append(math.log(max(value, 1e-12)))
        del hist[:-7]
        self.cost_ratio[key] = math.exp(statistics.median(hist))

    def _measured(self, entry: tuple[int, int], rbucket: int, context) -> tuple[float, float] | None:
        """(tokens, steps) behind ``entry``'s own acceptance at a row bucket: the bucket's decayed
        sums plus one step at the estimate over all buckets; None when never measured."""
        pooled = self.tokens_per_row_step.get((context, entry))
        if pooled is None:
            return None
        A, S = self._bucket_sums.get((context, entry, rbucket), (0.0, 0.0))
        return A + pooled, S + 1.0

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
        ``chain_prior`` by ``prior`` steps' weight (at most the steps it rests on); None when never
        measured.

        The prior keeps one unlucky probe from dismissing a shape: a 2-step window of 1x8 on the small
        model commits anywhere from 2 to 16 tokens, and a low first reading left the best shape
        unmeasured for the rest of a run (simulated with the small model's measured step costs and
        acceptance at one row and a noisy clock, 400 runs like the batch benchmark's: within 5% of
        the best fixed shape in 52% of them without the prior, 66% with it, 79% for that shape itself)."""
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
        t_ar = self.seconds_per_step.get((context, _AR, b))
        r = self.cost_ratio.get((context, entry, b))
        a = 1.0 if entry[1] == 1 else self.acceptance(entry, rows, context)  # L = 1 commits one
        if t_ar is None or r is None or a is None:
            return None
        return a * rows / max(t_ar * r, 1e-12)

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
        # drafting must beat plain decoding by ``margin``: a near tie gains nothing, and following
        # noisy near ties between AR and 1x4 ran the small model at 0.92x AR at 2-4 rows, where every
        # fixed shape was within 0.93-1.03x of AR
        score = {e: tp if e == _AR else tp / (1.0 + self.margin) for e, tp in tps.items()}
        best = max(self.menu, key=score.__getitem__)  # the first of equals: (1, 1) leads the menu
        share = self.explore / max(1, len(self.menu) - 1)  # the budget, split among the losers
        for entry in self.menu:  # re-measure a loser once the budget since it last ran covers its expected loss
            if entry == best:
                continue
            shortfall = 1.0 - score[entry] / score[best] if score[best] > 0 else 0.0
            loss = (self.probe * self.seconds_per_step[(context, _AR, bucket)]
                    * self.cost_ratio[(context, entry, bucket)] * shortfall)
            since = (self._clock.get((context, bucket, rbucket), 0.0)
                     - self._last_run.get((context, entry, bucket, rbucket), 0.0))
            if since * share > loss:
                return entry, self.probe
        return best, self.window


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
    slowest row, and every step costs the whole batch's price however few rows are left: pass
    ``laggard`` (the fewest tokens an active row has written) to both calls and a window is judged
    by that row's progress per step instead of the mean row's (at 32 rows of the small model, the
    mean row accepted 4 tokens per 1x8 step, which beat plain decoding on paper, but the batch took
    2x as long as plain decoding waiting for its slowest rows). A server that refills rows leaves it out.
    Such a batch also keeps computing its finished rows: pass ``batch`` (the rows a step computes) so
    that step time is looked up for that batch, not for the rows still active (at 8 rows of the small
    model with 2 left, 2-row costs picked 1x4, which costs 1.4x what it does at 2 rows).
    """

    def __init__(self, policy: SpeculationPolicy, context=None) -> None:
        self.policy, self.context = policy, context
        self._open = None  # (entry, rows, batch, tokens, row_steps, laggard, t0) of the window in flight

    def choose(self, rows: int, tokens: int, row_steps: int, laggard: int | None = None,
               batch: int | None = None) -> tuple[tuple[int, int], int]:
        """The entry for the next window and its length in steps; starts the window's clock."""
        rows = max(1, int(rows))
        entry, n = self.policy.choose(rows, self.context, batch)
        self._open = (entry, rows, batch, int(tokens), int(row_steps), laggard, time.perf_counter())
        return entry, n

    def observe(self, steps: int, tokens: int, row_steps: int, laggard: int | None = None) -> None:
        """End the window in flight after ``steps`` steps (a no-op when none is open)."""
        if self._open is None:
            return
        entry, rows, batch, tok0, rs0, lag0, t0 = self._open
        self._open = None
        seconds = time.perf_counter() - t0
        if lag0 is not None and laggard is not None:
            # the slowest row's tokens per step (a step commits at most L; a laggard stopped by EOS
            # hands the title to the next row, whose count may be higher: capped there)
            gain = max(0, min(int(laggard) - int(lag0), steps * entry[1]))
            self.policy.observe(entry, rows, steps, seconds, gain, steps, self.context, batch)
        else:
            self.policy.observe(entry, rows, steps, seconds, int(tokens) - tok0, int(row_steps) - rs0, self.context,
                                batch)
