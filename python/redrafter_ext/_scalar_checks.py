"""Checks of plain Python arguments (counts, sizes, ids, rates): the one rule set of every module.

An int is a Python ``int`` and never a ``bool`` (bools are ints to Python but never a count or an
id); a real is an int or a ``float``, and finite. Token ids read from data (a prompt, a model's
config) may also be NumPy integers (``is_integral``). Every failure is a ``ValueError`` that names
the op and the argument and says what was expected. Imports nothing from the package.
"""

from __future__ import annotations

import math
import numbers


def is_int(x: object) -> bool:
    """A Python int, not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_integral(x: object) -> bool:
    """``is_int`` or a NumPy integer (``numbers.Integral``): for ids read from data, often an array's."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x: object) -> bool:
    """A Python int or float, not a bool (finiteness is the checks' business)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _number(n: float) -> str:
    # 2**63 reads better than its 19 digits
    return f"2**{n.bit_length() - 1}" if is_int(n) and n > 1 << 32 and n & (n - 1) == 0 else str(n)


def _span(lo: float | None, hi: float | None, lo_open: bool, hi_open: bool) -> str:
    """The range ``lo (<|<=) v (<|<=) hi`` as a message writes it (``in [0, 1)``, ``>= 1``)."""
    if lo is not None and hi is not None:
        return f" in {'(' if lo_open else '['}{_number(lo)}, {_number(hi)}{')' if hi_open else ']'}"
    if lo is not None:
        return f" {'>' if lo_open else '>='} {_number(lo)}"
    return "" if hi is None else f" {'<' if hi_open else '<='} {_number(hi)}"


def check_int(op: str, name: str, v: object, lo: int | None = None, hi: int | None = None, hint: str = "") -> int:
    """``v``, an int with ``lo <= v < hi`` (a bound None: unbounded); ``hint`` ends the message."""
    if not is_int(v) or (lo is not None and v < lo) or (hi is not None and v >= hi):
        raise ValueError(f"{op}: {name} must be an int{_span(lo, hi, False, True)}{hint}, got {v!r}")
    return v


def check_real(op: str, name: str, v: object, lo: float | None = None, hi: float | None = None, *,
               lo_open: bool = False, hi_open: bool = False, hint: str = "") -> float:
    """``v``, a finite int or float with ``lo <= v <= hi`` (``lo_open``/``hi_open``: strict)."""
    ok = is_real(v) and (isinstance(v, int) or math.isfinite(v))
    if ok and lo is not None:
        ok = v > lo if lo_open else v >= lo
    if ok and hi is not None:
        ok = v < hi if hi_open else v <= hi
    if not ok:
        what = "a float" if lo is not None and hi is not None else "a finite float"  # ints pass too
        raise ValueError(f"{op}: {name} must be {what}{_span(lo, hi, lo_open, hi_open)}{hint}, got {v!r}")
    return v


def check_eos_id(op: str, name: str, eos_id: object, vocab_size: int) -> int | None:
    """``eos_id``: None (no EOS) or a token id, an int in ``[0, vocab_size)``."""
    if eos_id is not None and (not is_int(eos_id) or not 0 <= eos_id < vocab_size):
        raise ValueError(f"{op}: {name} must be None or an int in [0, {vocab_size}), got {eos_id!r}")
    return eos_id


def check_sampling(op: str, temperature: float, top_k: int, top_p: float) -> None:
    """The ranges of sampling: temperature finite >= 0, top_k an int >= 0, top_p in (0, 1]. No
    rounding: ``top_k=2.5`` and bools are rejected, as the native schemas would cast them."""
    check_real(op, "temperature", temperature, 0)
    check_int(op, "top_k", top_k, 0, hint=" (0: off)")
    check_real(op, "top_p", top_p, 0, 1, lo_open=True, hint=" (1: off)")
