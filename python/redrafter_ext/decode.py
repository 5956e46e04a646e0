"""The ReDrafter loop: ``decode_step`` (one speculative step, no host sync) and ``generate``.

One step, for B rows at once (W beams of L tokens, N = 1 + W*(L-1) trie nodes):
    beams      = drafter.beam_search(hidden, token)              # (B, W, L), beams[:, :, 0] = token
                 (lookup > 0: the last beam -> the prompt-lookup drafts, ops.ngram_lookup over state.history)
    trie       = ops.build_trie(beams)                           # (B, N) tokens/parents/depths
    mask       = ops.tree_mask(parent, num_nodes)                # (B, N, N) ancestor-or-self
    logits, h  = target(trie tokens, cache_len + depth, mask)    # (B, N, V), writes K/V at cache_len+n
    accept     = ops.verify_greedy(logits, beams, beam_node)     # longest beam agreeing with argmax
                 (or ops.verify_sample(..., uniforms, T, top_k, top_p): exact sampling)
    ops.kv_compact(kv, cache_len, path_nodes, accept)            # keep only the accepted path
                 (ops.kv_compact_paged(pages, block_table, ...) on a paged cache, models.PagedKV)
    commit root + accepted tokens to the output buffer; hidden, token <- last accepted node
Every tensor keeps its shape from step to step and the state is updated in place, so the step can
be captured in a CUDA graph; finished rows keep their shape and are masked.

Sampling (``SamplingParams``): the uniforms of ``verify_sample`` are drawn on the state's device from
a ``torch.Generator`` (seeded once by ``generate``), so sampling adds no host synchronisation and
a seed reproduces the output exactly. Temperature 0 is greedy decoding, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from ._checks import FLOAT_DTYPES, check_tensor
from ._generate_common import (
    GenerateOutput,
    Progress,
    Verified,
    cache_length,
    cache_room_error,
    check_beam_shape,
    check_context,
    check_every_arg,
    check_generate_args,
    check_state_sizes,
    policy_arg,
    prompt_rows,
    run_policy,
    run_until_done,
)
from ._scalar_checks import check_int, check_sampling
from ._shape_checks import LOOKUP_DEFAULT, NGRAM_MAX, menu_nodes_max, num_nodes_max
from .models import PagedKV
from .policy import SpeculationPolicy
from .profiling import StageTimer
from .sampling import sample_inverse_cdf, sampling_probs


def default_ops() -> ModuleType:
    """The native ops module (``redrafter_ext.ops``). No fallback: the torch extension is part of
    every install, so a missing one is an error (the reference is opt-in, ``ops=reference``); the
    MLX loop falls back because its extension is optional (``redrafter_ext.mlx.default_ops``)."""
    from . import ops

    return ops


@dataclass(frozen=True)
class SamplingParams:
    """Sampling from the target's distribution after temperature, top-k and top-p.

    temperature  >= 0; 0 is greedy (argmax, ``verify_greedy``), exactly
    top_k        >= 0; 0 keeps every token
    top_p        in (0, 1]; 1 keeps every token
    generator    ``torch.Generator`` on the decode device for the uniforms (None: torch's default
                 generator of that device)
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        check_sampling("sampling", self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return float(self.temperature) == 0.0

    def rand(self, *shape: int, device: torch.device) -> Tensor:
        """float32 uniforms in [0, 1) drawn on ``device`` (no host synchronisation)."""
        return torch.rand(*shape, generator=self.generator, device=device, dtype=torch.float32)

    def sample(self, logits: Tensor, u: Tensor | None = None) -> Tensor:
        """One token per row of ``logits (B, V)``: int32 ``(B,)`` (argmax when greedy), by inverse
        CDF at the uniforms ``u (B,)`` float32 (default: drawn from ``generator``)."""
        if self.greedy:
            return logits.argmax(-1).to(torch.int32)
        p = sampling_probs(logits, float(self.temperature), int(self.top_k), float(self.top_p))
        return sample_inverse_cdf(p, u if u is not None else self.rand(logits.shape[0], device=logits.device))


#: what ``sampling=None`` means wherever a token is drawn: the argmax
GREEDY = SamplingParams(0.0)


def _sampling_or_none(temperature: float, top_k: int, top_p: float, seed: int, device) -> SamplingParams | None:
    """generate's keyword options as ``SamplingParams`` (None: greedy); one generator, seeded once."""
    params = SamplingParams(temperature, top_k, top_p)  # validates
    if params.greedy:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return SamplingParams(temperature, top_k, top_p, gen)


@dataclass
class DecodeState:
    """Everything that changes across decode steps; all tensors on one device, updated in place.

    kv         (n_layers, 2, B, H_kv, S, D)  target KV cache, or a ``PagedKV`` (pages
               (n_layers, num_blocks, 2, H_kv, block_size, D) + block_table (B, max_blocks) int32,
               S = its ``length``); see docs/paged_kv.md
    cache_len  (B,) int32   tokens whose K/V are committed in ``kv``
    hidden     (B, H)       target hidden state (after final norm) at the last committed token
    token      (B,) int32   the guaranteed next token (target argmax, not yet in the cache)
    out        (B, max_new_tokens + L) int32  generated tokens; the last L columns are scratch
    num_out    (B,) int32   tokens written to ``out``
    done       (B,) bool    row finished (EOS committed or max_new_tokens reached)
    steps      (B,) int32   decode steps taken while the row was active
    nodes      (B,) int32   trie nodes verified while the row was active (sum over steps)
    max_new_tokens  int     the out buffer's capacity (and every row's limit unless ``limit``)
    eos_id     int | None   every row's EOS unless ``eos``
    limit      (B,) int32   per-row limit on generated tokens, <= max_new_tokens (default: max_new_tokens)
    eos        (B,) int32   per-row EOS id, -1 for none (default: eos_id)
    history    (B, S) int32 or None  the token of every cache slot: ``history[b, :cache_len[b]]`` is the
               row's prompt + committed tokens (slots past it are scratch). Needed by the lookup beam
               (``decode_step(lookup=n)``); every step keeps it current when present
    """

    kv: Tensor | PagedKV
    cache_len: Tensor
    hidden: Tensor
    token: Tensor
    out: Tensor
    num_out: Tensor
    done: Tensor
    steps: Tensor
    nodes: Tensor
    max_new_tokens: int
    eos_id: int | None = None
    limit: Tensor | None = None
    eos: Tensor | None = None
    history: Tensor | None = None

    def __post_init__(self) -> None:
        # per-row limits from the batch-wide ones (rows admitted later set their own, serving.Batch)
        like = self.cache_len
        if self.limit is None and isinstance(like, Tensor) and isinstance(self.max_new_tokens, int):
            self.limit = torch.full_like(like, self.max_new_tokens, dtype=torch.int32)
        if self.eos is None and isinstance(like, Tensor) and (self.eos_id is None or isinstance(self.eos_id, int)):
            self.eos = torch.full_like(like, -1 if self.eos_id is None else self.eos_id, dtype=torch.int32)

    @property
    def cache_slots(self) -> int:
        """S: each row's cache length (``PagedKV.length`` on a paged cache)."""
        return self.kv.length if isinstance(self.kv, PagedKV) else self.kv.shape[4]

    def compact(self, ops: ModuleType, path_nodes: Tensor, last: Tensor) -> None:
        """Keep path positions ``0..last[b]`` of every row's tree in the cache, either layout, and
        advance ``cache_len`` by ``last + 1`` (``last = -1``: row untouched)."""
        if isinstance(self.kv, PagedKV):  # the same move through the block table
            ops.kv_compact_paged(self.kv.pages, self.kv.block_table, self.cache_len, path_nodes, last)
        else:
            ops.kv_compact(self.kv, self.cache_len, path_nodes, last)

    def check(self, target, beam_width: int, beam_length: int, lookup: int = 0) -> None:
        """Metadata checks of every field (no tensor values are read), before anything is written."""
        op = "decode_step"
        check_beam_shape(op, beam_width, beam_length)
        check_int(op, "lookup", lookup, 0, NGRAM_MAX)
        if isinstance(self.kv, PagedKV):
            pages = check_tensor(op, "state.kv.pages", self.kv.pages, "n_layers, num_blocks, 2, H_kv, block_size, D",
                                 FLOAT_DTYPES)
            dev = pages.device
            check_tensor(op, "state.kv.block_table", self.kv.block_table, "B, max_blocks", (torch.int32,), dev)
            kv_batch, S = self.kv.batch, self.kv.length
        else:
            check_tensor(op, "state.kv", self.kv, "n_layers, 2, B, H_kv, S, D", FLOAT_DTYPES)
            dev = self.kv.device
            if self.kv.shape[1] != 2:
                raise ValueError(f"{op}: state.kv dim 1 must be 2 (K and V), got shape {tuple(self.kv.shape)}")
            kv_batch, S = self.kv.shape[2], self.kv.shape[4]
        check_tensor(op, "state.hidden", self.hidden, "B, H", FLOAT_DTYPES, dev)
        check_tensor(op, "state.out", self.out, "B, T", (torch.int32,), dev)
        for name in ("cache_len", "token", "num_out", "steps", "nodes", "limit", "eos"):
            check_tensor(op, f"state.{name}", getattr(self, name), "B", (torch.int32,), dev)
        check_tensor(op, "state.done", self.done, "B", (torch.bool,), dev)
        if lookup and self.history is None:
            raise ValueError(f"{op}: lookup={lookup} needs state.history, the (B, S) int32 tokens of the cache "
                             "slots (generate allocates it when lookup > 0)")
        if self.history is not None:
            check_tensor(op, "state.history", self.history, "B, S", (torch.int32,), dev)
            if self.history.shape[1] != S:
                raise ValueError(f"{op}: state.history must have S = {S} columns (one per cache slot), "
                                 f"got shape {tuple(self.history.shape)}")
        batches = {"state.kv": kv_batch, "state.hidden": self.hidden.shape[0], "state.out": self.out.shape[0]}
        for name in ("cache_len", "token", "num_out", "done", "steps", "nodes", "limit", "eos"):
            batches[f"state.{name}"] = getattr(self, name).shape[0]
        if self.history is not None:
            batches["state.history"] = self.history.shape[0]
        check_state_sizes(op, target, batches, self.hidden.shape[1], self.max_new_tokens, self.eos_id,
                          beam_width, beam_length, S, self.out.shape[1])


@torch.no_grad()
def decode_step(
    target, drafter, state: DecodeState, *, beam_width: int, beam_length: int, ops: ModuleType | None = None,
    timer: StageTimer | None = None, sampling: SamplingParams | None = None,
    uniforms: tuple[Tensor, Tensor] | None = None, check_room: bool = True, lookup: int = 0,
) -> Tensor:
    """One ReDrafter step for every row, in place on ``state``. Never synchronises with the host.

    Lookup beam (``lookup = n > 0``, L > 1): in rows where the row's last (at most n) tokens
    occurred earlier in ``state.history`` (prompt + output: ``ops.ngram_lookup``), the drafter's
    last (lowest-scored) beam is replaced by the L-1 tokens that followed the latest occurrence;
    other rows keep it. The trie keeps its ``N = 1 + W*(L-1)`` nodes, so the verify costs what it
    did. Verification treats it like any beam, so greedy output stays the target's and sampling
    stays exact (every draft is a point-mass proposal; docs/lookup.md).

    Cache room: the fixed-shape tree forward writes ``N = 1 + W*(L-1)`` K/V slots from
    ``cache_len[b]`` in every row, finished rows included, so each row needs
    ``0 <= cache_len[b] <= S - N`` before the step (``S`` the cache length; ``PagedKV.length`` on
    a paged cache, whose blocks of those slots must belong to the row). A row past that would
    attend to a truncated tree and commit a wrong token, or index out of bounds, so it is checked
    on the device (``torch._assert_async``, no host synchronisation): on the CPU the step raises
    ``ValueError`` naming the row and the room it needs, before anything is written; on a GPU a
    device-side assert fails the stream. ``generate`` proves the room on the host before its first
    step (prompt lengths, ``max_new_tokens`` and ``N`` bound every ``cache_len``) and skips it.

    Args:
        target: implements the target protocol (``redrafter_ext.models``).
        drafter: has ``beam_search(hidden, token, embed_weight, W, L, ops) -> (B, W, L)``.
        state: the decode state (see ``DecodeState``); every row needs room for ``cache_len + N``
            slots (above); with a ``PagedKV``, the blocks of those slots are allocated to the row
            in its block table.
        ops: ``redrafter_ext.ops`` (native, the default) or ``redrafter_ext.reference``.
        timer: optional ``StageTimer`` (adds synchronisation on GPUs; for profiling only).
        sampling: None or a greedy ``SamplingParams`` for greedy acceptance (``verify_greedy``);
            otherwise exact sampling (``verify_sample``) with uniforms from ``sampling.generator``.
        uniforms: optional ``(accept_u (B, L-1, W), sample_u (B,))`` float32 to use instead of
            drawing them (tests, replay); requires a non-greedy ``sampling``.
        check_room: assert the cache room on the device (above); pass False only when the caller
            has proved it on the host, as ``generate`` does.
        lookup: the lookup beam's longest key (0: no lookup beam); needs ``state.history``.

    Returns:
        ``(B,)`` int32 tokens committed by this step per row (0 for finished rows).
    """
    ops = ops or default_ops()
    state.check(target, beam_width, beam_length, lookup)
    if check_room:
        _check_overflow(state, num_nodes_max(beam_width, beam_length))
    if isinstance(state.kv, PagedKV) and getattr(ops, "kv_compact_paged", None) is None:
        raise ValueError(f"decode_step: ops {getattr(ops, '__name__', ops)!r} has no kv_compact_paged (paged cache)")
    if uniforms is not None and (sampling is None or sampling.greedy):
        raise ValueError("decode_step: uniforms are only used with sampling (temperature > 0)")
    if timer is None:
        return _step(target, drafter, state, beam_width, beam_length, ops, sampling, uniforms, lookup)
    # profiling hooks wrap the models and ops from outside; the step itself is the same
    target, drafter, ops = timer.hooks(target, drafter, ops)
    with timer.section("step"):
        return _step(target, drafter, state, beam_width, beam_length, ops, sampling, uniforms, lookup)


def _with_lookup_beam(state: DecodeState, beams: Tensor, lookup: int, ops) -> Tensor:
    """``beams (B, W, L)`` with the last beam's drafts replaced by the prompt-lookup drafts in the rows
    where a key occurred: ``(B, W, L)`` int32 (same N, so the verify costs what it did)."""
    L = beams.shape[2]
    hist = state.history
    # the key ends with the guaranteed token: put it in its slot (the commit writes the same token there)
    hist.scatter_(1, state.cache_len[:, None].to(torch.int64), state.token[:, None])
    drafts = ops.ngram_lookup(hist, state.cache_len + 1, lookup, L - 1)  # [B, L-1], -1: no occurrence
    return lookup_in_last_beam(beams.to(torch.int32), drafts)


def lookup_in_last_beam(beams: Tensor, drafts: Tensor) -> Tensor:
    """The lookup beam's rule, shared with ``bench/lookup_headroom.py``: ``beams (B, W, k)`` with the
    last beam's final m tokens replaced by ``drafts (B, m)`` (m <= k) in the rows where a key occurred
    (``drafts[:, 0] >= 0``; ``ops.ngram_lookup`` gives -1 otherwise). Same dtype as ``beams``."""
    k, m = beams.shape[2], drafts.shape[1]
    tail = torch.where(drafts[:, :1] >= 0, drafts.to(beams.dtype), beams[:, -1, k - m:])  # the lowest-scored beam gives way
    return torch.cat([beams[:, :-1], torch.cat([beams[:, -1, : k - m], tail], dim=1)[:, None]], dim=1)


def _step(target, drafter, state: DecodeState, W: int, L: int, ops, sampling: SamplingParams | None,
          uniforms: tuple[Tensor, Tensor] | None, lookup: int = 0) -> Tensor:
    """``decode_step`` after its checks."""
    if L == 1:  # nothing to draft: a plain decoding step, exactly autoregressive_generate's
        return _ar_step(target, state, sampling, None if uniforms is None else uniforms[1])
    # 1-3: draft, merge into a trie, build the ancestor mask
    beams = drafter.beam_search(state.hidden, state.token, target.embed_weight, W, L, ops)  # [B, W, L]
    if lookup:
        beams = _with_lookup_beam(state, beams, lookup, ops)  # [B, W, L]
    node_token, node_parent, node_depth, beam_node, num_nodes = ops.build_trie(beams)
    mask = ops.tree_mask(node_parent, num_nodes)  # [B, N, N]
    # 4-5: verify the whole trie in one target forward (K/V land at cache_len + node), then accept
    positions = state.cache_len[:, None] + node_depth  # [B, N]
    logits, hidden = target(node_token, positions, mask, state.cache_len, state.kv)
    if sampling is None or sampling.greedy:
        verified = Verified(*ops.verify_greedy(logits, beams, beam_node))
    else:
        B = beams.shape[0]
        if uniforms is None:
            uniforms = (sampling.rand(B, L - 1, W, device=logits.device), sampling.rand(B, device=logits.device))
        verified = Verified(*ops.verify_sample(logits, beams, beam_node, uniforms[0], uniforms[1],
                                               float(sampling.temperature), int(sampling.top_k),
                                               float(sampling.top_p)))
    return _commit(state, beams, verified, hidden, num_nodes, ops)


def _check_overflow(state: DecodeState, N: int) -> None:
    """Cache room, ``0 <= cache_len <= S - N`` in every row, asserted on the device (no host
    synchronisation); the MLX loop flags overflowing rows instead (its ``DecodeState.check_overflow``)."""
    S = state.cache_slots
    ok = ((state.cache_len >= 0) & (state.cache_len <= S - N)).all()
    try:
        torch._assert_async(ok, f"decode_step: cache overflow: every row needs 0 <= cache_len <= S - N = {S} - {N}")
    except RuntimeError:
        # only the CPU raises here, at once: its values are host memory, so naming the row costs no sync
        c = state.cache_len.tolist()  # sync-ok: CPU tensor, error path only
        b = next(i for i, x in enumerate(c) if not 0 <= x <= S - N)
        raise ValueError(cache_room_error("decode_step", b, c[b], N, S)) from None


def _commit(state: DecodeState, beams: Tensor, v: Verified, hidden: Tensor, num_nodes: Tensor, ops) -> Tensor:
    """Steps 6-7: compact the KV cache and write the committed tokens; updates ``state`` in place."""
    B, _, L = beams.shape
    i = torch.arange(L, device=beams.device)
    path_tokens = torch.gather(beams, 1, v.best_beam[:, None, None].to(torch.int64).expand(B, 1, L))[:, 0]  # [B, L]

    # commit root + accepted drafts, cut after an EOS and at max_new_tokens; -1 = inactive row
    n_commit = v.accept_len + 1
    is_eos = (path_tokens == state.eos[:, None]) & (i[None, :] < n_commit[:, None])  # eos -1: never
    first_eos = torch.where(is_eos, i[None, :], L).amin(dim=1)
    n_commit = torch.minimum(n_commit, first_eos + 1)
    n_commit = torch.minimum(n_commit, state.limit - state.num_out)
    n_commit = torch.where(state.done, 0, n_commit).to(torch.int32)
    last = n_commit - 1  # index of the last committed path position, -1 for inactive rows

    if state.history is not None:  # the whole path at its slots: those past the new cache_len are scratch
        state.history.scatter_(1, (state.cache_len[:, None] + i[None, :]).to(torch.int64), path_tokens.to(torch.int32))

    # 6: keep only the committed path's K/V; cache_len += n_commit
    state.compact(ops, v.path_nodes, last)

    # 7: fixed-shape scatter into the output buffer; uncommitted positions go to scratch columns
    scratch = state.out.shape[1] - L + i
    dst = torch.where(i[None, :] < n_commit[:, None], state.num_out[:, None] + i[None, :], scratch[None, :])
    state.out.scatter_(1, dst.to(torch.int64), path_tokens)
    last_node = torch.gather(v.path_nodes, 1, last.clamp(min=0)[:, None].to(torch.int64))  # [B, 1]
    new_hidden = torch.gather(hidden, 1, last_node[:, :, None].expand(B, 1, hidden.shape[2]))[:, 0]
    active = ~state.done
    state.hidden.copy_(torch.where(active[:, None], new_hidden.to(state.hidden.dtype), state.hidden))
    state.token.copy_(torch.where(active, v.next_token, state.token))
    state.steps.add_(active.to(torch.int32))
    state.nodes.add_(torch.where(active, num_nodes, 0))
    state.num_out.add_(n_commit)
    last_token = torch.gather(path_tokens, 1, last.clamp(min=0)[:, None].to(torch.int64))[:, 0]
    state.done |= _finished(state, n_commit > 0, last_token)
    return n_commit


def _finished(state: DecodeState, committed: Tensor, last_token: Tensor) -> Tensor:
    """The stopping rule of every step, ``(B,)`` bool: a row is done once it has written its limit of
    tokens, or when the last token it just committed is its EOS (``num_out`` already counts this step)."""
    return (state.num_out >= state.limit) | (committed & (last_token == state.eos))


def _stepper(target, drafter, state: DecodeState, ops, timer: StageTimer | None,
             sampling: SamplingParams | None, lookup: int = 0) -> Callable[[int, int], None]:
    """``step(W, L)``: ``decode_step`` on generate's own state, its metadata checked at the first
    step of each shape only (generate allocated the state and nothing reshapes it between steps;
    the checks cost 27 us, 0.7% of the small model's plain decoding step)."""
    ops = ops or default_ops()
    checked: set[tuple[int, int]] = set()

    def step(W: int, L: int) -> None:
        if timer is not None or (W, L) not in checked:
            # check_room=False: _start proved S >= prompt + max_new_tokens + N, which bounds every cache_len
            decode_step(target, drafter, state, beam_width=W, beam_length=L, ops=ops, timer=timer,
                        sampling=sampling, check_room=False, lookup=lookup)
            checked.add((W, L))
        else:
            _step(target, drafter, state, W, L, ops, sampling, None, lookup)

    return step


def _run_policy(target, drafter, state: DecodeState, policy: SpeculationPolicy, check_every: int,
                ops, timer: StageTimer | None, sampling: SamplingParams | None, lookup: int = 0) -> GenerateOutput:
    """generate's loop under a ``SpeculationPolicy``: at each read, the rows' progress and the wall
    clock since the last read update the policy, which picks (W, L) for the next window."""
    calls = run_policy(_stepper(target, drafter, state, ops, timer, sampling, lookup), lambda: _progress(state), policy,
                       sampling, state.max_new_tokens, check_every, state.eos_id is not None,
                       batch=state.token.shape[0])
    return _finish(state, calls)


def _ar_step(target, state: DecodeState, sampling: SamplingParams | None, sample_u: Tensor | None = None) -> Tensor:
    """One plain decoding step in place on ``state`` (``decode_step`` with L = 1, and
    ``autoregressive_generate``): commit ``state.token``, then take the next token at it. Returns
    ``(B,)`` int32 tokens committed (1 for active rows)."""
    B = state.token.shape[0]
    active = ~state.done
    tok = state.token.clone()  # state.token is overwritten below
    ones = torch.ones(B, 1, 1, dtype=torch.bool, device=tok.device)
    logits, hidden = target(tok[:, None], state.cache_len[:, None], ones, state.cache_len, state.kv)
    dst = torch.where(active, state.num_out, state.out.shape[1] - 1).to(torch.int64)
    state.out.scatter_(1, dst[:, None], tok[:, None])
    if state.history is not None:  # an inactive row's slot at cache_len is scratch
        state.history.scatter_(1, state.cache_len[:, None].to(torch.int64), tok[:, None])
    a = active.to(torch.int32)
    state.cache_len.add_(a)
    state.num_out.add_(a)
    state.steps.add_(a)
    state.nodes.add_(a)
    nxt = (sampling or GREEDY).sample(logits[:, 0], sample_u)
    state.token.copy_(torch.where(active, nxt, tok))
    state.hidden.copy_(torch.where(active[:, None], hidden[:, 0].to(state.hidden.dtype), state.hidden))
    state.done |= _finished(state, active, tok)
    return a


def _prepare_prompts(target, prompts: Sequence[Sequence[int]] | Tensor, device,
                     max_new_tokens: int = 0) -> tuple[Tensor, Tensor]:
    """Right-pad prompts into ``(B, T)`` int64 + ``lengths (B,)`` after validating them on the host."""
    if isinstance(prompts, Tensor):
        if prompts.dim() != 2:
            raise ValueError(f"generate: prompts must be a (B, T) tensor or a list of lists, got shape {tuple(prompts.shape)}")
        prompts = prompts.tolist()  # sync-ok: host-side validation before decoding starts
    rows = prompt_rows(prompts, target.vocab_size)
    check_context(rows, max_new_tokens, target)
    T = max(map(len, rows))
    tokens = torch.zeros(len(rows), T, dtype=torch.int64)
    for b, p in enumerate(rows):
        tokens[b, : len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in rows], dtype=torch.int32)
    return tokens.to(device), lengths.to(device)


@torch.no_grad()
def _start(target, prompts, max_new_tokens: int, slack: int, eos_id: int | None, max_len: int | None,
           sampling: SamplingParams | None = None, paged_kv: PagedKV | None = None, history: bool = False):
    """Validate, allocate the cache (or take the caller's ``paged_kv``) and prefill (the first
    token sampled when ``sampling``); ``history``: also the (B, S) token history, the prompts in it."""
    check_generate_args(max_new_tokens, eos_id, target.vocab_size)
    dev = target.embed_weight.device
    tokens, lengths = _prepare_prompts(target, prompts, dev, max_new_tokens)
    B, T = tokens.shape
    if paged_kv is not None:
        if not isinstance(paged_kv, PagedKV):
            raise TypeError(f"generate: paged_kv must be a PagedKV, got {type(paged_kv).__name__}")
        if max_len is not None:
            raise ValueError("generate: pass max_len or paged_kv, not both (paged_kv.max_len sets the cache length)")
        if paged_kv.batch != B or paged_kv.device != dev:
            raise ValueError(f"generate: paged_kv has {paged_kv.batch} rows on {paged_kv.device}, "
                             f"the prompts need {B} on {dev}")
        max_len = paged_kv.length
    S = cache_length(T, max_new_tokens, slack, max_len)
    kv = paged_kv if paged_kv is not None else target.new_kv_cache(B, S)
    logits, hidden = target.prefill(tokens, lengths, kv)
    z = torch.zeros(B, dtype=torch.int32, device=dev)
    state = DecodeState(
        kv=kv, cache_len=lengths.clone(), hidden=hidden,
        token=(sampling or SamplingParams(0.0)).sample(logits),
        out=torch.zeros(B, max_new_tokens + slack, dtype=torch.int32, device=dev), num_out=z.clone(),
        done=torch.full((B,), max_new_tokens == 0, device=dev), steps=z.clone(), nodes=z.clone(),
        max_new_tokens=max_new_tokens, eos_id=eos_id,
    )
    if history:
        state.history = torch.zeros(B, S, dtype=torch.int32, device=dev)
        state.history[:, :T] = tokens.to(torch.int32)
    return state


def _finish(state: DecodeState, calls: int) -> GenerateOutput:
    out = state.out.cpu()  # sync-ok: the result leaves the device once, after the loop
    n = state.num_out.tolist()  # sync-ok
    return GenerateOutput(
        tokens=[out[b, : n[b]].tolist() for b in range(len(n))],  # sync-ok
        steps=state.steps.tolist(),  # sync-ok
        nodes=state.nodes.tolist(),  # sync-ok
        state=state,
        calls=calls,
    )


def _progress(state: DecodeState) -> Progress:
    """The rows' progress, in one host read."""
    m = state.max_new_tokens
    stats = torch.stack([state.done.all().to(torch.int64), torch.where(state.done, m, state.limit - state.num_out).amin(),
                         (~state.done).sum(), state.num_out.sum(), state.steps.sum(),
                         torch.where(state.done, m, state.num_out).amin()])
    done, rem, active, tokens, row_steps, lag = stats.tolist()  # sync-ok: generate's read, between steps
    return Progress(bool(done), int(rem), int(active), int(tokens), int(row_steps), int(lag))


def _run(step, state: DecodeState, per_step: int, check_every: int) -> GenerateOutput:
    calls = run_until_done(step, lambda: _progress(state), state.max_new_tokens, per_step, check_every,
                           state.eos_id is not None)
    return _finish(state, calls)


@torch.no_grad()
def generate(
    target, drafter, prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int, *, beam_width: int | str = 4,
    beam_length: int | str = 4, eos_id: int | None = None, ops: ModuleType | None = None,
    check_every: int | None = None, max_len: int | None = None, timer: StageTimer | None = None,
    temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int = 0, paged_kv: PagedKV | None = None,
    policy: SpeculationPolicy | None = None, lookup: int = LOOKUP_DEFAULT,
) -> GenerateOutput:
    """ReDrafter generation: prefill, then ``decode_step`` until every row is done.

    Args:
        prompts: B prompts of any lengths (list of token-id lists, or a ``(B, T)`` tensor).
        max_new_tokens: per-row limit on generated tokens (EOS included).
        beam_width, beam_length: W and L (L counts the guaranteed token; L = 1 is plain AR), or
            both ``"auto"``: a fresh ``SpeculationPolicy`` picks them as the run goes.
        policy: a ``SpeculationPolicy`` choosing (W, L) per window of steps from measured cost and
            acceptance (``redrafter_ext.policy``); pass the same one to successive calls to keep
            its calibration. Greedy output is identical to plain decoding whatever it picks.
        lookup: let the prompt-lookup drafts, with keys of at most this many tokens, take the place
            of the last drafter beam where a key occurred (default 2; 0: off; ``decode_step``); N is
            unchanged, the state gains a ``history``.
        eos_id: stop a row after it commits this token.
        check_every: with an ``eos_id``, read the rows' progress on the host at least once every this many
            steps (default: every step on a CPU, where a read costs nothing, 4 on an accelerator);
            reads are also placed where a row can first reach ``max_new_tokens``, so without EOS no
            step runs after the last row finished.
        max_len: cache length S (default: just enough).
        timer: optional ``StageTimer`` collecting per-stage time.
        temperature, top_k, top_p: sampling (``SamplingParams``); temperature 0 (the default) is
            greedy. With sampling, the tokens follow the target's processed distribution exactly
            (exact recursive rejection over the trie, ``verify_sample``).
        seed: seeds the one ``torch.Generator`` (on the target's device) of all the uniforms.
        paged_kv: decode on this caller-owned paged cache (``PagedKV``, B rows, length >= prompt +
            max_new_tokens + N) instead of allocating a contiguous one; its rows' blocks are
            overwritten. Results equal the contiguous cache's with ``max_len = paged_kv.length``.

    Returns:
        ``GenerateOutput``; greedy: tokens equal ``autoregressive_generate``'s, token for token;
        sampling: distributed as ``autoregressive_generate``'s with the same options, and
        reproducible for a given seed.
    """
    check_every = check_every_arg(check_every, target.embed_weight.device)
    policy = policy_arg(beam_width, beam_length, policy)
    lookup = check_int("generate", "lookup", lookup, 0, NGRAM_MAX)
    sampling = _sampling_or_none(temperature, top_k, top_p, seed, target.embed_weight.device)
    if policy is not None:  # the cache and the output buffer fit the largest entry: switching reallocates nothing
        N = menu_nodes_max(policy.menu)
        state = _start(target, prompts, max_new_tokens, max(N, policy.max_length), eos_id, max_len,
                       sampling, paged_kv, history=lookup > 0)
        return _run_policy(target, drafter, state, policy, check_every, ops=ops, timer=timer, sampling=sampling,
                           lookup=lookup)
    N = num_nodes_max(beam_width, beam_length)
    state = _start(target, prompts, max_new_tokens, max(N, beam_length), eos_id, max_len, sampling, paged_kv,
                   history=lookup > 0)
    step = _stepper(target, drafter, state, ops, timer, sampling, lookup)
    return _run(lambda: step(beam_width, beam_length), state, beam_length, check_every)


@torch.no_grad()
def autoregressive_generate(
    target, prompts: Sequence[Sequence[int]] | Tensor, max_new_tokens: int, *, eos_id: int | None = None,
    check_every: int | None = None, max_len: int | None = None, temperature: float = 0.0, top_k: int = 0,
    top_p: float = 1.0, seed: int = 0, paged_kv: PagedKV | None = None,
) -> GenerateOutput:
    """Plain decoding with the same target and cache: one token per forward.

    Greedy by default; ``temperature > 0`` samples each token from the target's distribution after
    temperature, top-k and top-p (``sampling.sampling_probs``), uniforms from one generator seeded
    with ``seed``: the baseline ``generate`` matches in distribution. ``paged_kv`` and
    ``check_every`` as in ``generate``.
    """
    check_every = check_every_arg(check_every, target.embed_weight.device)
    sampling = _sampling_or_none(temperature, top_k, top_p, seed, target.embed_weight.device) or SamplingParams(0.0)
    state = _start(target, prompts, max_new_tokens, 1, eos_id, max_len, sampling, paged_kv)
    return _run(lambda: _ar_step(target, state, sampling), state, 1, check_every)
