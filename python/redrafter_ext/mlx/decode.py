"""The ReDrafter loop on MLX: ``decode_step`` (one speculative step, no host reads) and ``generate``.

One step, for B rows at once (W beams of L tokens, N = 1 + W*(L-1) trie nodes):
    beams        = drafter.beam_search(hidden, token)              # (B, W, L)
                   (lookup > 0: the last beam -> the prompt-lookup drafts, ops.ngram_lookup over state.history)
    trie         = ops.build_trie(beams)                           # (B, N) tokens/parents/depths
    mask         = ops.tree_mask(parent, num_nodes)                # (B, N, N) ancestor-or-self
    logits, h, kv = target(trie tokens, cache_len + depth, mask)   # (B, N, V), K/V at cache_len+n
    accept       = ops.verify_greedy(logits, beams, beam_node)     # or ops.verify_sample(...)
    kv, cache_len = ops.kv_compact(kv, cache_len, path_nodes, accept)
    commit root + accepted tokens to the output buffer (and the history); hidden, token <- last accepted node

The same algorithm as ``redrafter_ext.decode``, written functionally: MLX arrays are immutable, so
``decode_step`` returns a new ``DecodeState`` instead of updating one in place. Everything stays
lazy: the step builds a graph and never reads a value on the host; ``generate`` schedules each step
with ``mx.async_eval`` and reads the rows' progress only where a row can have finished.

Sampling: the uniforms come from ``mx.random`` with an explicit key carried in the state (split
once per step), so a seed reproduces the output exactly and no host RNG is involved.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from types import ModuleType

import mlx.core as mx

from .. import _generate_common as common  # the host-side parts both backends' loops share
from .._generate_common import GenerateOutput, Progress, Verified
from .._scalar_checks import check_int, check_sampling
from .._shape_checks import LOOKUP_DEFAULT, NGRAM_MAX, OPS, menu_nodes_max, num_nodes_max
from ..policy import SpeculationPolicy
from . import reference
from ._checks import FLOAT_DTYPES, check_array
from .sampling import sample_inverse_cdf, sampling_probs

log = logging.getLogger("redrafter_ext.mlx")
_default_ops: ModuleType | None = None


def native_ops() -> ModuleType | None:
    """``redrafter_ext.mlx.ops`` when it imports, its native extension loaded and every op of ``OPS`` present."""
    try:
        from . import ops
    except (ImportError, OSError) as e:  # no module, or no loadable compiled extension behind it
        log.debug("redrafter_ext.mlx.ops unavailable: %s", e)
        return None
    return ops if all(callable(getattr(ops, n, None)) for n in OPS) else None


def default_ops() -> ModuleType:
    """The native ops (``redrafter_ext.mlx.ops``) when present, else the pure-MLX ``reference``."""
    global _default_ops
    if _default_ops is None:
        _default_ops = native_ops() or reference
        log.info("redrafter_ext.mlx: using %s ops (%s)", "native" if _default_ops is not reference else "reference",
                 _default_ops.__name__)
    return _default_ops


@dataclass(frozen=True)
class SamplingParams:
    """Sampling from the target's distribution after temperature, top-k and top-p.

    temperature >= 0 (0 is greedy: argmax and ``verify_greedy``, exactly); top_k >= 0 (0: off);
    top_p in (0, 1] (1: off).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        check_sampling("sampling", self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    def sample(self, logits: mx.array, u: mx.array | None) -> mx.array:
        """One token per row of ``logits (B, V)`` with uniforms ``u (B,)``: int32 ``(B,)``."""
        if self.greedy:
            return mx.argmax(logits, axis=-1).astype(mx.int32)
        p = sampling_probs(logits, float(self.temperature), int(self.top_k), float(self.top_p))
        return sample_inverse_cdf(p, u)


@dataclass(frozen=True)
class DecodeState:
    """Everything that changes across decode steps (immutable: each step returns a new state).

    kv         (n_layers, 2, B, H_kv, S, D)  target KV cache
    cache_len  (B,) int32   tokens whose K/V are committed in ``kv``
    hidden     (B, H)       target hidden state (after final norm) at the last committed token
    token      (B,) int32   the guaranteed next token (not yet in the cache)
    out        (B, max_new_tokens + L) int32  generated tokens; the last L columns are scratch
    num_out    (B,) int32   tokens written to ``out``
    done       (B,) bool    row finished (EOS committed or max_new_tokens reached)
    steps      (B,) int32   decode steps taken while the row was active
    nodes      (B,) int32   trie nodes verified while the row was active
    key        mx.random key for the sampling uniforms (None when greedy)
    overflow   (B,) bool    the row lacked cache room for a step and was stopped (None: never checked);
               see ``decode_step`` and ``check_overflow``
    history    (B, S) int32 or None  the token of every cache slot: ``history[b, :cache_len[b]]`` is the
               row's prompt + committed tokens (slots past it are scratch). Needed by the lookup beam
               (``decode_step(lookup=n)``); every step keeps it current when present
    """

    kv: mx.array
    cache_len: mx.array
    hidden: mx.array
    token: mx.array
    out: mx.array
    num_out: mx.array
    done: mx.array
    steps: mx.array
    nodes: mx.array
    max_new_tokens: int
    eos_id: int | None = None
    key: mx.array | None = None
    overflow: mx.array | None = None
    history: mx.array | None = None

    def check_overflow(self) -> None:
        """Raise ``ValueError`` naming the first row ``decode_step`` stopped for lack of cache room.

        Reads ``overflow`` and ``cache_len`` on the host: call it where the engine reads values
        anyway (as ``generate`` reads ``done``), not after every step.
        """
        if self.overflow is None or not bool(mx.any(self.overflow).item()):  # sync-ok: caller's host read point
            return
        b = self.overflow.tolist().index(True)  # sync-ok: error path
        c = self.cache_len.tolist()[b]  # sync-ok: error path
        S = self.kv.shape[4]
        raise ValueError(f"decode_step: cache overflow in row {b}: cache_len = {c} leaves room for {max(S - c, 0)} of "
                         f"the S = {S} cache slots, fewer than the N = 1 + W*(L-1) tree slots a step writes; "
                         "the row was stopped without committing (every row, finished or not, needs cache_len + N <= S)")

    def arrays(self) -> list[mx.array]:
        """Every array of the state (for ``mx.eval``/``mx.async_eval``)."""
        return [v for f in fields(self) if isinstance(v := getattr(self, f.name), mx.array)]

    def check(self, target, beam_width: int, beam_length: int, lookup: int = 0) -> None:
        """Metadata checks of every field (no values are read)."""
        op = "decode_step"
        common.check_beam_shape(op, beam_width, beam_length)
        check_int(op, "lookup", lookup, 0, NGRAM_MAX)
        check_array(op, "state.kv", self.kv, "n_layers, 2, B, H_kv, S, D", FLOAT_DTYPES)
        if self.kv.shape[1] != 2:
            raise ValueError(f"{op}: state.kv must have shape (n_layers, 2, B, H_kv, S, D), got {tuple(self.kv.shape)}")
        S = self.kv.shape[4]
        check_array(op, "state.hidden", self.hidden, "B, H", FLOAT_DTYPES)
        check_array(op, "state.out", self.out, "B, T", (mx.int32,))
        for name in ("cache_len", "token", "num_out", "steps", "nodes"):
            check_array(op, f"state.{name}", getattr(self, name), "B", (mx.int32,))
        check_array(op, "state.done", self.done, "B", (mx.bool_,))
        if lookup and self.history is None:
            raise ValueError(f"{op}: lookup={lookup} needs state.history, the (B, S) int32 tokens of the cache "
                             "slots (generate allocates it when lookup > 0)")
        if self.history is not None:
            check_array(op, "state.history", self.history, "B, S", (mx.int32,))
            if self.history.shape[1] != S:
                raise ValueError(f"{op}: state.history must have S = {S} columns (one per cache slot), "
                                 f"got shape {tuple(self.history.shape)}")
        batches = {"state.kv": self.kv.shape[2], "state.hidden": self.hidden.shape[0], "state.out": self.out.shape[0]}
        for name in ("cache_len", "token", "num_out", "done", "steps", "nodes"):
            batches[f"state.{name}"] = getattr(self, name).shape[0]
        if self.history is not None:
            batches["state.history"] = self.history.shape[0]
        common.check_state_sizes(op, target, batches, self.hidden.shape[1], self.max_new_tokens, self.eos_id,
                                 beam_width, beam_length, S, self.out.shape[1])


def decode_step(
    target, drafter, state: DecodeState, *, beam_width: int, beam_length: int, ops: ModuleType | None = None,
    sampling: SamplingParams | None = None, uniforms: tuple[mx.array, mx.array] | None = None,
    check_room: bool = True, lookup: int = 0,
) -> tuple[DecodeState, mx.array]:
    """One ReDrafter step for every row. Lazy: builds the graph and never reads a value on the host.

    Lookup beam (``lookup = n > 0``, L > 1): in rows where the row's last (at most n) tokens
    occurred earlier in ``state.history`` (prompt + output: ``ops.ngram_lookup``), the drafter's
    last (lowest-scored) beam is replaced by the L-1 tokens that followed the latest occurrence;
    other rows keep it. The trie keeps its ``N = 1 + W*(L-1)`` nodes. Verification treats it like
    any beam, so greedy output stays the target's and sampling stays exact (every draft is a
    point-mass proposal; docs/lookup.md). As in the torch loop.

    Cache room: the fixed-shape tree forward writes ``N = 1 + W*(L-1)`` K/V slots from
    ``cache_len[b]`` in every row, finished rows included, so each row needs
    ``0 <= cache_len[b] <= S - N`` before the step. MLX has no asynchronous assert and a lazy
    graph cannot raise, so a row without room is stopped instead, in the graph: it commits nothing
    (tokens, K/V, ``cache_len``), is marked ``done`` and flagged in ``state.overflow``; the writes
    of its tree are clamped into its own cache (``LlamaTarget``), never another row's. Read the
    flags where the loop reads ``done`` anyway: ``new_state.check_overflow()`` raises naming the
    row. ``generate`` proves the room on the host before its first step and skips this.

    Args:
        target: implements the MLX target protocol (``redrafter_ext.mlx.models``).
        drafter: has ``beam_search(hidden, token, embed_weight, W, L, ops) -> (B, W, L)``.
        state: the decode state; every row needs room for ``cache_len + N`` slots (above).
        ops: a module with the six ops (default: ``default_ops()``).
        sampling: None or greedy for ``verify_greedy``; otherwise exact sampling (``verify_sample``)
            with uniforms drawn from ``state.key``.
        uniforms: optional ``(accept_u (B, L-1, W), sample_u (B,))`` float32 to use instead of
            drawing them (tests, replay); requires a non-greedy ``sampling``.
        check_room: stop and flag rows without room (above); pass False only when the caller has
            proved the room on the host, as ``generate`` does.
        lookup: the lookup beam's longest key (0: no lookup beam); needs ``state.history``.

    Returns:
        ``(new_state, n_commit)``: ``n_commit (B,)`` int32 tokens committed per row (0 when finished).
    """
    ops = ops or default_ops()
    state.check(target, beam_width, beam_length, lookup)
    W, L = beam_width, beam_length
    greedy = sampling is None or sampling.greedy
    if uniforms is not None and greedy:
        raise ValueError("decode_step: uniforms are only used with sampling (temperature > 0)")
    B = state.token.shape[0]

    # 1-3: draft, merge into a trie, build the ancestor mask
    beams = drafter.beam_search(state.hidden, state.token, target.embed_weight, W, L, ops)  # [B, W, L]
    history = state.history
    if lookup and L > 1:
        beams, history = _with_lookup_beam(state, beams, lookup, ops)  # [B, W, L]
    node_token, node_parent, node_depth, beam_node, num_nodes = ops.build_trie(beams)
    mask = ops.tree_mask(node_parent, num_nodes)  # [B, N, N]

    # 4-5: verify the whole trie in one target forward (K/V land at cache_len + node), then accept
    positions = state.cache_len[:, None] + node_depth  # [B, N]
    logits, hidden, kv = target(node_token, positions, mask, state.cache_len, state.kv)
    key = state.key
    if greedy:
        verified = Verified(*ops.verify_greedy(logits, beams, beam_node))
    else:
        if uniforms is None:
            if key is None:
                raise ValueError("decode_step: sampling needs state.key (an mx.random.key)")
            key, k_acc, k_next = mx.random.split(key, 3)
            uniforms = (mx.random.uniform(shape=(B, L - 1, W), key=k_acc), mx.random.uniform(shape=(B,), key=k_next))
        verified = Verified(*ops.verify_sample(logits, beams, beam_node, uniforms[0], uniforms[1],
                                               float(sampling.temperature), int(sampling.top_k),
                                               float(sampling.top_p)))
    no_room = None
    if check_room:
        S = state.kv.shape[4]
        no_room = (state.cache_len < 0) | (state.cache_len > S - num_nodes_max(W, L))
    return _commit(replace(state, history=history), kv, key, beams, verified, hidden, num_nodes, ops, no_room)


def _write_slots(history: mx.array, start: mx.array, tokens: mx.array) -> mx.array:
    """``history (B, S)`` with ``tokens (B, k)`` at slots ``start[b] .. start[b]+k-1``, those past S
    dropped. A dense select rather than a scatter: no index can leave the row, whatever ``start``
    holds (a row without cache room is stopped in the graph, not refused on the host)."""
    k = tokens.shape[1]
    rel = mx.arange(history.shape[1], dtype=mx.int32)[None, :] - start[:, None]  # [B, S] slot - start
    picked = mx.take_along_axis(tokens.astype(mx.int32), mx.clip(rel, 0, k - 1), axis=1)
    return mx.where((rel >= 0) & (rel < k), picked, history)


def _with_lookup_beam(state: DecodeState, beams: mx.array, lookup: int, ops) -> tuple[mx.array, mx.array]:
    """``beams (B, W, L)`` with the last beam's drafts replaced by the prompt-lookup drafts in the rows
    where a key occurred: ``(beams (B, W, L) int32, history)``, the history with the guaranteed
    token written at slot ``cache_len``."""
    L = beams.shape[2]
    beams = beams.astype(mx.int32)
    # the key ends with the guaranteed token: put it in its slot (the commit writes the same token there)
    hist = _write_slots(state.history, state.cache_len, state.token[:, None])
    drafts = ops.ngram_lookup(hist, state.cache_len + 1, lookup, L - 1).astype(mx.int32)  # [B, L-1], -1: none
    last = mx.where(drafts[:, :1] >= 0, drafts, beams[:, -1, 1:])  # the lowest-scored beam gives way
    last = mx.concatenate([beams[:, -1, :1], last], axis=1)
    return mx.concatenate([beams[:, :-1], last[:, None]], axis=1), hist


def _gather_rows(a: mx.array, idx: mx.array) -> mx.array:
    """``a[b, idx[b]]`` for ``a (B, T, ...)`` and ``idx (B,)`` (clamped into range)."""
    idx = mx.clip(idx.astype(mx.int32), 0, a.shape[1] - 1).reshape((-1, 1) + (1,) * (a.ndim - 2))
    return mx.take_along_axis(a, mx.broadcast_to(idx, (a.shape[0], 1) + tuple(a.shape[2:])), axis=1)[:, 0]


def _commit(state: DecodeState, kv: mx.array, key: mx.array | None, beams: mx.array, v: Verified, hidden: mx.array,
            num_nodes: mx.array, ops, no_room: mx.array | None = None):
    """Steps 6-7: compact the KV cache, write the committed tokens; returns (new state, n_commit).
    Rows in ``no_room`` (B,) bool commit nothing and are marked done and flagged in ``overflow``."""
    overflow = state.overflow
    if no_room is not None:
        overflow = no_room if overflow is None else overflow | no_room
        state = replace(state, done=state.done | no_room)
    B, _, L = beams.shape
    i = mx.arange(L, dtype=mx.int32)
    path_tokens = _gather_rows(beams, v.best_beam).astype(mx.int32)  # [B, L]

    # commit root + accepted drafts, cut after an EOS and at max_new_tokens; -1 = inactive row
    n_commit = v.accept_len.astype(mx.int32) + 1
    if state.eos_id is not None:
        is_eos = (path_tokens == state.eos_id) & (i[None, :] < n_commit[:, None])
        first_eos = mx.min(mx.where(is_eos, i[None, :], L), axis=1)
        n_commit = mx.minimum(n_commit, first_eos + 1)
    n_commit = mx.minimum(n_commit, state.max_new_tokens - state.num_out)
    n_commit = mx.where(state.done, 0, n_commit).astype(mx.int32)
    last = n_commit - 1  # the last committed path position, -1 for inactive rows

    # the whole path at its slots: those past the new cache_len are scratch
    history = None if state.history is None else _write_slots(state.history, state.cache_len, path_tokens)

    # 6: keep only the committed path's K/V; cache_len += n_commit
    kv, cache_len = ops.kv_compact(kv, state.cache_len, v.path_nodes, last)

    # 7: fixed-shape scatter into the output buffer; uncommitted positions go to scratch columns
    scratch = state.out.shape[1] - L + i
    dst = mx.where(i[None, :] < n_commit[:, None], state.num_out[:, None] + i[None, :], scratch[None, :])
    out = mx.put_along_axis(state.out, dst, path_tokens, axis=1)
    last_c = mx.maximum(last, 0)
    last_node = _gather_rows(v.path_nodes[:, :, None], last_c)[:, 0]  # [B]
    new_hidden = _gather_rows(hidden, last_node)
    active = ~state.done
    num_out = state.num_out + n_commit
    last_tok = _gather_rows(path_tokens[:, :, None], last_c)[:, 0]
    finished = _finished(num_out, state.max_new_tokens, state.eos_id, n_commit > 0, last_tok)
    new = replace(
        state,
        kv=kv,
        cache_len=cache_len,
        hidden=mx.where(active[:, None], new_hidden.astype(state.hidden.dtype), state.hidden),
        token=mx.where(active, v.next_token.astype(mx.int32), state.token),
        out=out,
        num_out=num_out,
        done=state.done | finished,
        steps=state.steps + active.astype(mx.int32),
        nodes=state.nodes + mx.where(active, num_nodes, 0).astype(mx.int32),
        key=key,
        overflow=overflow,
        history=history,
    )
    return new, n_commit


def _finished(num_out: mx.array, max_new_tokens: int, eos_id: int | None, committed: mx.array,
              last_token: mx.array) -> mx.array:
    """The stopping rule of every step: a row is done once it has written ``max_new_tokens``, or
    when the last token it just committed is the EOS (``num_out`` already counts this step)."""
    finished = num_out >= max_new_tokens
    return finished if eos_id is None else finished | (committed & (last_token == eos_id))


def _prepare_prompts(target, prompts, max_new_tokens: int = 0) -> tuple[mx.array, mx.array]:
    """Right-pad prompts into ``(B, T)`` int32 + ``lengths (B,)`` after validating them on the host."""
    if isinstance(prompts, mx.array):
        if prompts.ndim != 2:
            raise ValueError(f"generate: prompts must be a (B, T) array or a list of lists, got shape {prompts.shape}")
        prompts = prompts.tolist()  # sync-ok: host-side validation before decoding starts
    rows = common.prompt_rows(prompts, target.vocab_size)
    common.check_context(rows, max_new_tokens, target)
    T = max(map(len, rows))
    tokens = mx.array([p + [0] * (T - len(p)) for p in rows], dtype=mx.int32)
    lengths = mx.array([len(p) for p in rows], dtype=mx.int32)
    return tokens, lengths


def _sampling_or_none(temperature: float, top_k: int, top_p: float) -> SamplingParams | None:
    params = SamplingParams(temperature, top_k, top_p)  # validates
    return None if params.greedy else params


def _start(target, prompts, max_new_tokens: int, slack: int, eos_id: int | None, max_len: int | None,
           sampling: SamplingParams | None, seed: int, history: bool = False) -> DecodeState:
    """Validate, allocate the cache and prefill (the first token sampled when ``sampling``);
    ``history``: also the (B, S) token history, the prompts in it."""
    common.check_generate_args(max_new_tokens, eos_id, target.vocab_size)
    tokens, lengths = _prepare_prompts(target, prompts, max_new_tokens)
    B, T = tokens.shape
    S = common.cache_length(T, max_new_tokens, slack, max_len)
    kv = target.new_kv_cache(B, S)
    logits, hidden, kv = target.prefill(tokens, lengths, kv)
    key = None
    u = None
    if sampling is not None:
        key, k0 = mx.random.split(mx.random.key(int(seed)))
        u = mx.random.uniform(shape=(B,), key=k0)
    token = (sampling or SamplingParams(0.0)).sample(logits, u)
    z = mx.zeros((B,), dtype=mx.int32)
    state = DecodeState(
        kv=kv, cache_len=lengths, hidden=hidden, token=token,
        out=mx.zeros((B, max_new_tokens + slack), dtype=mx.int32), num_out=z,
        done=mx.full((B,), max_new_tokens == 0, dtype=mx.bool_), steps=z, nodes=z,
        max_new_tokens=max_new_tokens, eos_id=eos_id, key=key,
        history=mx.pad(tokens, ((0, 0), (0, S - T))) if history else None,
    )
    mx.eval(state.arrays())
    return state


def _finish(state: DecodeState, calls: int) -> GenerateOutput:
    mx.eval(state.arrays())
    out = state.out.tolist()  # sync-ok: the result leaves the device once, after the loop
    n = state.num_out.tolist()  # sync-ok
    return GenerateOutput(
        tokens=[out[b][: n[b]] for b in range(len(n))],
        steps=state.steps.tolist(),  # sync-ok
        nodes=state.nodes.tolist(),  # sync-ok
        state=state,
        calls=calls,
    )


def _progress(state: DecodeState) -> Progress:
    """The rows' progress, in one host read."""
    m = state.max_new_tokens
    remaining = mx.min(mx.where(state.done, m, m - state.num_out))
    stats = mx.stack([mx.all(state.done).astype(mx.int32), remaining.astype(mx.int32),
                      mx.sum((~state.done).astype(mx.int32)), mx.sum(state.num_out), mx.sum(state.steps),
                      mx.min(mx.where(state.done, m, state.num_out))])
    done, rem, rows, tokens, row_steps, lag = stats.astype(mx.int32).tolist()  # sync-ok: generate's read
    return Progress(bool(done), int(rem), int(rows), int(tokens), int(row_steps), int(lag))


def generate(
    target, drafter, prompts: Sequence[Sequence[int]] | mx.array, max_new_tokens: int, *,
    beam_width: int | str = 4, beam_length: int | str = 4, eos_id: int | None = None, ops: ModuleType | None = None,
    check_every: int | None = None, max_len: int | None = None, temperature: float = 0.0, top_k: int = 0,
    top_p: float = 1.0, seed: int = 0, policy: SpeculationPolicy | None = None, lookup: int = LOOKUP_DEFAULT,
) -> GenerateOutput:
    """ReDrafter generation on MLX: prefill, then ``decode_step`` until every row is done.

    Args:
        prompts: B prompts of any lengths (list of token-id lists, or a ``(B, T)`` array).
        max_new_tokens: per-row limit on generated tokens (EOS included).
        beam_width, beam_length: W and L (L counts the guaranteed token; L = 1 is plain AR), or
            both ``"auto"``: a fresh ``SpeculationPolicy`` picks them as the run goes.
        policy: a ``redrafter_ext.policy.SpeculationPolicy`` choosing (W, L) per window of steps
            from measured cost and acceptance, as in the torch ``generate``; pass the same one to
            successive calls to keep its calibration. Greedy output is identical to plain decoding
            whatever it picks.
        lookup: let the prompt-lookup drafts, with keys of at most this many tokens, take the place
            of the last drafter beam where a key occurred (default 2; 0: off; ``decode_step``); N is
            unchanged, the state gains a ``history``.
        eos_id: stop a row after it commits this token.
        ops: a module with the six ops (default: native ``redrafter_ext.mlx.ops`` when present, else
            ``redrafter_ext.mlx.reference``).
        check_every: with an ``eos_id``, read the rows' progress at least once every this many steps
            (default: 4, as on the torch loop's accelerators: a read waits for the lazy graph); reads
            also fall where a row can first reach ``max_new_tokens``.
        max_len: cache length S (default: just enough).
        temperature, top_k, top_p: sampling; temperature 0 (the default) is greedy.
        seed: seeds the ``mx.random`` key of all the uniforms.

    Returns:
        ``GenerateOutput``; greedy: the tokens of ``autoregressive_generate``, token for token;
        sampling: distributed as ``autoregressive_generate``'s, reproducible for a given seed.
    """
    check_every = common.check_every_arg(check_every)
    policy = common.policy_arg(beam_width, beam_length, policy)
    lookup = check_int("generate", "lookup", lookup, 0, NGRAM_MAX)
    sampling = _sampling_or_none(temperature, top_k, top_p)
    ops = ops or default_ops()
    if policy is not None:  # the cache and the output buffer fit the largest entry: switching reallocates nothing
        N = menu_nodes_max(policy.menu)
        state = _start(target, prompts, max_new_tokens, max(N, policy.max_length), eos_id, max_len,
                       sampling, seed, history=lookup > 0)
        box = [state]

        def step_wl(W: int, L: int) -> None:
            box[0], _ = decode_step(target, drafter, box[0], beam_width=W, beam_length=L, ops=ops, sampling=sampling,
                                    check_room=False, lookup=lookup)
            mx.async_eval(box[0].arrays())

        calls = common.run_policy(step_wl, lambda: _progress(box[0]), policy, sampling, max_new_tokens,
                                  check_every, eos_id is not None, batch=state.token.shape[0])
        return _finish(box[0], calls)
    N = num_nodes_max(beam_width, beam_length)
    state = _start(target, prompts, max_new_tokens, max(N, beam_length), eos_id, max_len, sampling, seed,
                   history=lookup > 0)
    box = [state]

    def step() -> None:
        # check_room=False: _start proved S >= prompt + max_new_tokens + N, which bounds every cache_len
        box[0], _ = decode_step(target, drafter, box[0], beam_width=beam_width, beam_length=beam_length, ops=ops,
                                sampling=sampling, check_room=False, lookup=lookup)
        mx.async_eval(box[0].arrays())  # schedules the step; the host runs ahead to build the next

    calls = common.run_until_done(step, lambda: _progress(box[0]), max_new_tokens, beam_length, check_every,
                                  eos_id is not None)
    return _finish(box[0], calls)


def autoregressive_generate(
    target, prompts: Sequence[Sequence[int]] | mx.array, max_new_tokens: int, *, eos_id: int | None = None,
    check_every: int | None = None, max_len: int | None = None, temperature: float = 0.0, top_k: int = 0,
    top_p: float = 1.0, seed: int = 0,
) -> GenerateOutput:
    """Plain decoding with the same target and cache: one token per forward (the baseline);
    ``check_every`` as in ``generate``."""
    check_every = common.check_every_arg(check_every)
    sampling = _sampling_or_none(temperature, top_k, top_p)
    state = _start(target, prompts, max_new_tokens, 1, eos_id, max_len, sampling, seed)
    params = sampling or SamplingParams(0.0)
    B = state.token.shape[0]
    ones = mx.ones((B, 1, 1), dtype=mx.bool_)
    box = [state]

    def step() -> None:
        state = box[0]
        active = ~state.done
        tok = state.token
        logits, hidden, kv = target(tok[:, None], state.cache_len[:, None], ones, state.cache_len, state.kv)
        key, u = state.key, None
        if sampling is not None:
            key, k = mx.random.split(key)
            u = mx.random.uniform(shape=(B,), key=k)
        # commit `tok`: write it, advance the cache, take the next token
        dst = mx.where(active, state.num_out, state.out.shape[1] - 1)
        out = mx.put_along_axis(state.out, dst[:, None], tok[:, None], axis=1)
        a = active.astype(mx.int32)
        num_out = state.num_out + a
        finished = _finished(num_out, max_new_tokens, eos_id, active, tok)
        state = replace(
            state, kv=kv, cache_len=state.cache_len + a, hidden=mx.where(active[:, None], hidden[:, 0], state.hidden),
            token=mx.where(active, params.sample(logits[:, 0], u), tok), out=out, num_out=num_out,
            done=state.done | finished, steps=state.steps + a, nodes=state.nodes + a, key=key,
        )
        mx.async_eval(state.arrays())
        box[0] = state

    calls = common.run_until_done(step, lambda: _progress(box[0]), max_new_tokens, 1, check_every, eos_id is not None)
    return _finish(box[0], calls)
