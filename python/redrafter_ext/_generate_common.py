"""Host-side parts of ``generate`` shared by the torch and MLX decode loops (imports neither).

Argument checks run once before decoding starts, on plain Python values (by the rules of
``_scalar_checks``); ``Progress`` is the loops' host read between steps, ``GenerateOutput`` the
result of both backends' ``generate``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from ._scalar_checks import check_eos_id, check_int, is_integral
from .policy import PolicyWindows, SpeculationPolicy


def _row_list(p: object) -> object:
    """A row as a Python list when it is an array (torch, NumPy, MLX), else unchanged."""
    return p.tolist() if hasattr(p, "tolist") and not isinstance(p, (list, tuple)) else p  # sync-ok: prompts, before decoding


def prompt_rows(prompts: Iterable[Iterable[int]], vocab_size: int) -> list[list[int]]:
    """The prompts as lists of ints, each non-empty with ids in ``[0, vocab_size)``.

    Rejected with a message naming ``prompts``: text (tokenize first), a flat list of ints (one
    prompt must be wrapped: ``[[...]]``), and non-integer ids (floats, bools), which are never rounded.
    """
    if isinstance(prompts, (str, bytes)):
        raise TypeError("generate: prompts is a string: tokenize it first (prompts are token ids, "
                        "a list of lists of ints or a (B, T) integer tensor)")
    prompts = _row_list(prompts)
    if not isinstance(prompts, Iterable):
        raise TypeError(f"generate: prompts must be a list of token-id lists, got {type(prompts).__name__}")
    prompts = list(prompts)
    if not prompts:
        raise ValueError("generate: prompts is empty")
    V = vocab_size
    rows = []
    for b, p in enumerate(prompts):
        p = _row_list(p)
        if isinstance(p, (str, bytes)):
            raise TypeError(f"generate: prompts[{b}] is a string: tokenize it first (each prompt is a list of "
                            "int token ids)")
        if is_integral(p):
            raise TypeError(f"generate: prompts must be a list of token-id lists (one per row), got a flat list "
                            f"of ints; for one prompt pass [[{p}, ...]]")
        if not isinstance(p, Iterable):
            raise TypeError(f"generate: prompts[{b}] must be a list of int token ids, got {type(p).__name__}")
        p = list(p)
        if not p:
            raise ValueError(f"generate: prompts[{b}] is empty")
        for i, t in enumerate(p):
            if not is_integral(t):
                raise TypeError(f"generate: prompts[{b}][{i}] = {t!r} is not an int token id "
                                f"({type(t).__name__}; ids are never rounded)")
        bad = [t for t in p if not 0 <= t < V]
        if bad:
            raise ValueError(f"generate: prompts[{b}] has token id {bad[0]} outside the vocabulary [0, {V})")
        rows.append([int(t) for t in p])
    return rows


def check_generate_args(max_new_tokens: int, eos_id: int | None, vocab_size: int) -> None:
    check_int("generate", "max_new_tokens", max_new_tokens, 0)
    check_eos_id("generate", "eos_id", eos_id, vocab_size)


def max_positions(target: object) -> int | None:
    """The target's ``config.max_position_embeddings`` (its context length), None when it has none."""
    n = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    return n if is_integral(n) and n > 0 else None


def check_context(rows: list[list[int]], max_new_tokens: int, target: object) -> None:
    """Prompt + max_new_tokens must fit in the target's context (``max_position_embeddings``).

    Draft nodes past it in the last step are never committed, so only committed positions count.
    """
    P = max_positions(target)
    if P is None:
        return
    b = max(range(len(rows)), key=lambda r: len(rows[r]))
    n = len(rows[b]) + max_new_tokens
    if n > P:
        raise ValueError(
            f"generate: prompts[{b}] has {len(rows[b])} tokens; with max_new_tokens={max_new_tokens} the sequence "
            f"reaches {n} positions, past the model's max_position_embeddings={P} (shorten the prompt or lower "
            "max_new_tokens)"
        )


def cache_length(T: int, max_new_tokens: int, slack: int, max_len: int | None) -> int:
    """Cache slots S: ``max_len``, or by default just enough, which is prompt ``T`` + ``max_new_tokens``
    + ``slack`` (the tree of the last step starts at most at prompt + max_new - 1 and needs ``slack``)."""
    need = T + max_new_tokens + slack
    S = max_len or need
    if S < need:
        raise ValueError(
            f"generate: max_len={S} leaves no room: prompt {T} + max_new_tokens {max_new_tokens} "
            f"+ trie N={slack} needs {need} cache slots"
        )
    return S


def cache_room_error(op: str, row: int, cache_len: int, N: int, S: int) -> str:
    """The message for a row without room for the N tree slots a decode step writes."""
    return (
        f"{op}: cache overflow in row {row}: cache_len = {cache_len}, and a step writes N = 1 + W*(L-1) = {N} tree "
        f"slots from there, so it needs {cache_len + N} cache slots, but the cache has S = {S} (room for "
        f"{max(S - cache_len, 0)}); every row, finished or not, needs cache_len + N <= S before each step "
        "(give the cache more slots, or park a finished row at cache_len = 0)"
    )


def check_beam_shape(op: str, beam_width, beam_length) -> None:
    check_int(op, "beam_width", beam_width, 1)
    check_int(op, "beam_length", beam_length, 1)


def check_state_sizes(op: str, target, batches: dict[str, int], hidden_cols: int, max_new_tokens, eos_id,
                      beam_width: int, beam_length: int, S: int, out_cols: int) -> int:
    """The framework-free part of ``DecodeState.check`` (torch and MLX): one batch size over the
    fields (``batches``: field -> its batch), the hidden width, the scalars, the trie's room in the
    cache and the output buffer's width. Returns B."""
    from ._shape_checks import common_batch

    B = common_batch(op, batches)
    if hidden_cols != target.hidden_size:
        raise ValueError(f"{op}: state.hidden must have shape (B, H) = ({B}, {target.hidden_size}), "
                         f"got ({batches.get('state.hidden')}, {hidden_cols})")
    m = check_int(op, "state.max_new_tokens", max_new_tokens, 0)
    check_eos_id(op, "state.eos_id", eos_id, target.vocab_size)
    N = 1 + beam_width * (beam_length - 1)
    if N > S:
        raise ValueError(f"{op}: the trie needs N = 1 + W*(L-1) = {N} cache slots but the cache has S = {S}")
    if out_cols < m + beam_length:
        raise ValueError(f"{op}: state.out needs max_new_tokens + L = {m + beam_length} columns, got {out_cols}")
    return B


def check_every_arg(check_every: int | None, device=None) -> int:
    """The validated read interval; None: 1 on a torch CPU device (reading host memory costs
    nothing there, and a step run after every row stopped at EOS costs a whole step), else 4: on an
    accelerator a read waits for the device, and MLX (no ``device``) waits for its lazy graph."""
    if check_every is None:
        return 1 if device is not None and getattr(device, "type", None) == "cpu" else 4
    return check_int("generate", "check_every", check_every, 1)


class Progress(NamedTuple):
    """The rows' progress: the loop's one host read between steps (each backend's ``_progress``)."""

    done: bool  # every row is done
    remaining: int  # the fewest tokens an active row may still write
    rows: int  # active rows
    tokens: int  # tokens written, all rows together
    row_steps: int  # decode steps taken by active rows, all rows together
    laggard: int  # the fewest tokens an active row has written: the slowest row's progress


def steps_until_check(check_every: int, min_remaining: int, per_step: int, eos: bool) -> int:
    """Steps to run before the loop next reads the rows' progress on the host.

    No row can reach ``max_new_tokens`` in fewer than ``ceil(min_remaining / per_step)`` steps
    (``min_remaining``: the fewest tokens an active row still may write; a step commits at most
    ``per_step`` = L tokens), so a read before then could only find rows stopped by EOS. Without an
    EOS id the loop waits exactly that long: no step runs after the last row finished, and no read
    is spent early. With one, a row may stop at any step: at most ``check_every`` steps.
    """
    n = max(1, -(-min_remaining // per_step))
    return min(n, check_every) if eos else n


def run_until_done(step: Callable[[], None], progress: Callable[[], Progress], max_new_tokens: int,
                   per_step: int, check_every: int, eos: bool) -> int:
    """The decode loop of ``generate``: calls ``step()`` until ``progress()`` (one host read) says
    every row is done, reading only when ``steps_until_check`` says a row can have finished.
    Returns the number of steps."""
    calls, due = 0, steps_until_check(check_every, max_new_tokens, per_step, eos)
    while calls < max_new_tokens:
        step()
        calls += 1
        if calls == due:
            p = progress()
            if p.done:
                break
            due = calls + steps_until_check(check_every, p.remaining, per_step, eos)
    return calls


def policy_arg(beam_width, beam_length, policy) -> SpeculationPolicy | None:
    """The ``SpeculationPolicy`` a ``generate`` call runs under: ``policy`` itself, or a fresh one
    when W and L are both ``"auto"``; None for a fixed shape, whose W and L are checked here, before
    anything runs (a call that runs no step would never reach ``decode_step``'s check)."""
    auto = (beam_width == "auto", beam_length == "auto")
    if any(auto) and not all(auto):
        raise ValueError("generate: beam_width and beam_length are 'auto' together (a policy picks both), "
                         f"got {beam_width!r}, {beam_length!r}")
    if policy is None and all(auto):
        policy = SpeculationPolicy()
    if policy is not None and not isinstance(policy, SpeculationPolicy):
        raise TypeError(f"generate: policy must be a SpeculationPolicy, got {type(policy).__name__}")
    if policy is None:
        check_beam_shape("generate", beam_width, beam_length)
    return policy


def run_policy(step: Callable[[int, int], None], progress: Callable[[], Progress], policy: SpeculationPolicy,
               sampling: Any, max_new_tokens: int, check_every: int, eos: bool, batch: int | None = None) -> int:
    """The decode loop of ``generate`` under a ``SpeculationPolicy``: at each read, the policy picks
    (W, L) and a window length from the rows' progress, and is told the window's cost and gain when
    it ends (``policy.PolicyWindows``, its estimates kept per sampling setting: None or an object
    with ``temperature``, ``top_k``, ``top_p``); ``step(W, L)`` runs one step, ``progress()`` is one
    host read. The window keeps the loop's own reads (EOS, limits) inside it; it is judged by the
    slowest row's progress, which is what ends the batch. ``batch``: the rows every step computes
    (finished ones included), which set its cost. Returns the number of steps."""
    context = None if sampling is None else (float(sampling.temperature), int(sampling.top_k), float(sampling.top_p))
    windows = PolicyWindows(policy, context)
    p, calls = progress(), 0
    while not p.done and calls < max_new_tokens:
        (W, L), n = windows.choose(p.rows, p.tokens, p.row_steps, laggard=p.laggard, batch=batch)
        n, ran = min(n, max_new_tokens - calls), 0
        while ran < n and not p.done:
            k = min(n - ran, steps_until_check(check_every, p.remaining, L, eos))
            for _ in range(k):
                step(W, L)
            ran += k
            p = progress()
        calls += ran
        windows.observe(ran, p.tokens, p.row_steps, laggard=p.laggard)
    return calls


class Verified(NamedTuple):
    """What ``verify_greedy`` / ``verify_sample`` decide (arrays of either framework), for ``_commit``."""

    accept_len: Any  # (B,) int32 accepted drafts
    best_beam: Any  # (B,) int32 the lowest beam holding the accepted path
    path_nodes: Any  # (B, L) int32 nodes of the accepted path, -1 past accept_len
    next_token: Any  # (B,) int32 the target's token at the last accepted node


@dataclass
class GenerateOutput:
    """tokens: generated ids per row (EOS included when hit); steps/nodes: per-row decode steps and
    trie nodes verified; state: the final decode state (cache included) of the backend that ran;
    calls: decode steps run for the whole batch (``calls - max(steps)`` ran with every row done)."""

    tokens: list[list[int]]
    steps: list[int]
    nodes: list[int]
    state: Any
    calls: int = 0

    @property
    def tokens_per_step(self) -> float:
        """Mean committed tokens per decode step over all rows (accepted + 1)."""
        return sum(map(len, self.tokens)) / max(1, sum(self.steps))
