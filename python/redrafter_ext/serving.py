"""In-flight batching: a running batch whose rows are admitted and retired between steps.

    batch = rx.Batch(target, rows=8, max_new_tokens=256, max_len=2048, beam_width=4, beam_length=4)
    row = batch.admit([1, 2, 3], max_new_tokens=64, eos_id=2)   # prefill into a free row
    while batch.busy:
        batch.step(drafter)                                      # decode_step on every row
        for row in batch.finished():                             # one host read
            tokens = batch.retire(row)                           # the row is free again

``decode_step`` itself never synchronises with the host; admitting, retiring and ``finished()`` are
host-side operations between steps (an engine's scheduler runs there anyway). A free or retired
row stays in the fixed-shape batch as a finished row: it commits nothing, and its cache length is
reset so that its scratch tree always has room. With a paged cache (``paged=True``), rows take
their blocks from a ``BlockPool`` when admitted and give them back when retired; free rows point
at a few parking blocks of their own, so the scratch writes of a free row never touch a block that
an active row owns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._generate_common import check_context, prompt_rows
from ._scalar_checks import check_eos_id, check_int
from ._shape_checks import LOOKUP_DEFAULT, NGRAM_MAX, num_nodes_max
from .decode import GREEDY, DecodeState, SamplingParams, decode_step
from .models import PagedKV

__all__ = ["Batch", "BlockPool", "row_uniforms"]

_M64 = (1 << 64) - 1


def _i64(x: int) -> int:
    """An unsigned 64-bit constant as the int64 torch computes with (two's complement)."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def row_uniforms(seed: Tensor, counter: Tensor, n: int) -> Tensor:
    """``(B, n)`` float32 uniforms in [0, 1) from a per-row ``seed (B,)`` and ``counter (B,)`` (int64),
    by the splitmix64 finaliser of ``seed``, ``counter`` and the column: each row's stream depends
    on its own seed and counter only, so a request samples the same tokens whatever rows share its
    batch. 24 bits, as ``torch.rand``'s float32. Device ops only (no host read)."""
    col = torch.arange(n, device=seed.device, dtype=torch.int64)
    x = seed[:, None] * _i64(0x9E3779B97F4A7C15) + counter[:, None] * _i64(0xD1B54A32D192ED03) + col[None, :]
    x = x + _i64(0x9E3779B97F4A7C15)
    x = (x ^ _shr(x, 30)) * _i64(0xBF58476D1CE4E5B9)
    x = (x ^ _shr(x, 27)) * _i64(0x94D049BB133111EB)
    x = x ^ _shr(x, 31)
    return _shr(x, 40).to(torch.float32) * (1.0 / (1 << 24))


class BlockPool:
    """The free physical blocks of a paged cache (host-side free list).

    ``reserved`` blocks (the parking blocks of free rows) are never handed out.
    """

    def __init__(self, num_blocks: int, reserved: Sequence[int] = ()) -> None:
        res = set(reserved)
        # a stack: the blocks released last are handed out first (still warm in the caches)
        self._free = [b for b in reversed(range(num_blocks)) if b not in res]
        self._owned: set[int] = set()

    @property
    def free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"BlockPool: {n} blocks needed, {len(self._free)} free: retire a row or add blocks")
        ids = [self._free.pop() for _ in range(n)]
        self._owned.update(ids)
        return ids

    def release(self, ids: Sequence[int]) -> None:
        bad = [b for b in ids if b not in self._owned]
        if bad:
            raise ValueError(f"BlockPool: blocks {bad} are not allocated (released twice?)")
        self._owned.difference_update(ids)
        self._free.extend(reversed(ids))


class Batch:
    """A batch of ``rows`` decode rows with its own cache; requests come and go between steps.

    Args:
        target: the target model (``LlamaTarget`` or anything with its protocol, plus
            ``new_kv_cache``/``new_paged_kv_cache``).
        rows: rows of the batch (the fixed batch size of every step).
        max_new_tokens: the largest per-request limit (the output buffer's width).
        max_len: cache slots per row (contiguous), or per request (paged): a request needs
            ``prompt + max_new_tokens + N`` of them.
        beam_width, beam_length: the largest trie the batch will run (N = 1 + W*(L-1)).
        paged: use a paged cache with ``num_blocks`` blocks of ``block_size`` slots.
        sampling: ``SamplingParams`` (temperature, top-k, top-p) of every request (None: greedy);
            each request draws its uniforms from its own ``seed`` (``admit``) and step counter
            (``row_uniforms``), so its tokens do not depend on the other rows.
        lookup: the prompt-lookup beam's longest key at every step (default 2; 0: none; ``decode_step``); the
            batch then keeps each row's token history (the trie keeps its N).
    """

    def __init__(self, target, rows: int, max_new_tokens: int, max_len: int, *, beam_width: int = 4,
                 beam_length: int = 4, paged: bool = False, num_blocks: int | None = None, block_size: int = 16,
                 sampling: SamplingParams | None = None, lookup: int = LOOKUP_DEFAULT) -> None:
        for name, v in (("rows", rows), ("max_new_tokens", max_new_tokens), ("max_len", max_len),
                        ("beam_width", beam_width), ("beam_length", beam_length), ("block_size", block_size)):
            check_int("Batch", name, v, 0 if name == "max_new_tokens" else 1)
        self.lookup = check_int("Batch", "lookup", lookup, 0, NGRAM_MAX)
        self.target, self.sampling = target, sampling
        self.W, self.L = beam_width, beam_length
        self.N = num_nodes_max(beam_width, beam_length)
        self.slack = max(self.N, beam_length)
        if max_len < self.slack + 1:
            raise ValueError(f"Batch: max_len={max_len} leaves no room for a prompt and a trie of N={self.N}")
        dev = target.embed_weight.device
        self.pool: BlockPool | None = None
        if paged:
            per_row = -(-max_len // block_size)
            park = -(-self.slack // block_size)  # the scratch tree of a free row
            num_blocks = num_blocks if num_blocks is not None else park + rows * per_row
            if num_blocks <= park:
                raise ValueError(f"Batch: num_blocks={num_blocks} leaves no block beside the {park} parking blocks")
            self._park = list(range(park))
            table = self._parking_row(per_row, dev).expand(rows, per_row).contiguous()
            kv = target.new_paged_kv_cache(rows, max_len, block_size, num_blocks=num_blocks, block_table=table)
            self.pool = BlockPool(num_blocks, reserved=self._park)
            self._blocks: dict[int, list[int]] = {}
        else:
            kv = target.new_kv_cache(rows, max_len)
        z = torch.zeros(rows, dtype=torch.int32, device=dev)
        self.state = DecodeState(
            kv=kv, cache_len=z.clone(), hidden=torch.zeros(rows, target.hidden_size, dtype=target.embed_weight.dtype,
                                                           device=dev),
            token=z.clone(), out=torch.zeros(rows, max_new_tokens + self.slack, dtype=torch.int32, device=dev),
            num_out=z.clone(), done=torch.ones(rows, dtype=torch.bool, device=dev), steps=z.clone(), nodes=z.clone(),
            max_new_tokens=max_new_tokens, limit=z.clone(), eos=torch.full_like(z, -1),
            history=torch.zeros(rows, max_len, dtype=torch.int32, device=dev) if self.lookup else None,
        )
        self.max_len = max_len
        self._free = list(range(rows))
        self.seed = torch.zeros(rows, dtype=torch.int64, device=dev)  # per-row sampling streams
        self.draws = torch.zeros(rows, dtype=torch.int64, device=dev)

    def _parking_row(self, width: int, device) -> Tensor:
        """A block-table row over the parking blocks only (a free row's scratch tree lands there)."""
        park = torch.tensor(self._park, dtype=torch.int32)
        return park.repeat(-(-width // len(park)))[:width].to(device)

    # -- host-side bookkeeping ------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.state.cache_len.shape[0]

    @property
    def free_rows(self) -> list[int]:
        return sorted(self._free)

    @property
    def busy(self) -> list[int]:
        return [r for r in range(self.rows) if r not in self._free]

    def _check_row(self, op: str, row: int) -> None:
        check_int(f"Batch.{op}", "row", row, 0, self.rows)

    # -- admit / retire -------------------------------------------------------------------------
    @torch.no_grad()
    def admit(self, prompt: Sequence[int], *, row: int | None = None, max_new_tokens: int | None = None,
              eos_id: int | None = None, seed: int = 0) -> int:
        """Prefill ``prompt`` into a free row (the lowest, or ``row``) and return the row.

        Other rows keep their cache and progress. Raises before anything is written when the row
        is busy, the prompt is bad or longer than the room, or the block pool is exhausted.
        """
        target, st = self.target, self.state
        if row is None:
            if not self._free:
                raise RuntimeError("Batch.admit: every row is busy: retire a finished row first")
            row = min(self._free)
        self._check_row("admit", row)
        if row not in self._free:
            raise ValueError(f"Batch.admit: row {row} is busy (retire it first)")
        limit = st.max_new_tokens if max_new_tokens is None else max_new_tokens
        check_int("Batch.admit", "max_new_tokens", limit, 0, st.max_new_tokens + 1)
        check_eos_id("Batch.admit", "eos_id", eos_id, target.vocab_size)
        check_int("Batch.admit", "seed", seed, 0, 1 << 63)
        (ids,) = prompt_rows([prompt], target.vocab_size)
        need = len(ids) + limit + self.slack
        if need > self.max_len:
            raise ValueError(f"Batch.admit: prompt of {len(ids)} tokens + max_new_tokens {limit} + trie {self.slack} "
                             f"needs {need} cache slots, the batch has {self.max_len} per row")
        check_context([ids], limit, target)
        dev = st.cache_len.device
        if self.pool is not None:
            bs = st.kv.block_size
            blocks = self.pool.allocate(-(-need // bs))
            table = st.kv.block_table
            row_table = self._parking_row(table.shape[1], table.device)
            row_table[: len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
            table[row].copy_(row_table)
            self._blocks[row] = blocks
            kv_row = PagedKV(st.kv.pages, table[row: row + 1], st.kv.max_len)
        else:
            kv_row = st.kv[:, :, row: row + 1]  # a view: the prefill writes into the batch's cache
        tokens = torch.tensor([ids], dtype=torch.int64, device=dev)
        logits, hidden = target.prefill(tokens, torch.tensor([len(ids)], dtype=torch.int32, device=dev), kv_row)
        self.seed[row] = seed
        self.draws[row] = 0
        u = row_uniforms(self.seed[row: row + 1], self.draws[row: row + 1], 1)[:, 0]
        first = (self.sampling or GREEDY).sample(logits, u)
        self.draws[row] = 1
        st.cache_len[row] = len(ids)
        if st.history is not None:
            st.history[row, : len(ids)] = tokens[0].to(torch.int32)
        st.hidden[row] = hidden[0].to(st.hidden.dtype)
        st.token[row] = first[0]
        st.out[row].zero_()
        for name in ("num_out", "steps", "nodes"):
            getattr(st, name)[row] = 0
        st.limit[row] = limit
        st.eos[row] = -1 if eos_id is None else eos_id
        st.done[row] = limit == 0
        self._free.remove(row)
        return row

    @torch.no_grad()
    def retire(self, row: int) -> list[int]:
        """Free ``row`` (finished or not) and return the tokens it generated; its paged blocks go
        back to the pool."""
        self._check_row("retire", row)
        if row in self._free:
            raise ValueError(f"Batch.retire: row {row} is not busy (retired twice?)")
        st = self.state
        n = int(st.num_out[row])  # sync-ok: between steps, the request leaves
        tokens = st.out[row, :n].tolist()  # sync-ok
        st.done[row] = True
        st.cache_len[row] = 0  # room for the scratch tree of a free row
        if self.pool is not None:
            table = st.kv.block_table
            table[row].copy_(self._parking_row(table.shape[1], table.device))
            self.pool.release(self._blocks.pop(row))
        self._free.append(row)
        return tokens

    def finished(self) -> list[int]:
        """Busy rows that are done (one host read)."""
        done = self.state.done.tolist()  # sync-ok: the scheduler's read between steps
        return [r for r in self.busy if done[r]]

    def step(self, drafter, *, beam_width: int | None = None, beam_length: int | None = None, ops=None) -> Tensor:
        """One ``decode_step`` over every row (free rows commit nothing). (W, L) default to the
        batch's and may be any shape whose trie fits (N <= the batch's)."""
        W = self.W if beam_width is None else beam_width
        L = self.L if beam_length is None else beam_length
        check_int("Batch.step", "beam_width", W, 1)
        check_int("Batch.step", "beam_length", L, 1)
        if num_nodes_max(W, L) > self.N or L > self.L:
            raise ValueError(f"Batch.step: W={W}, L={L} is larger than the batch was sized for ({self.W}, {self.L})")
        uniforms = None
        if self.sampling is not None and not self.sampling.greedy:
            # this step's uniforms, one stream per row: (accept_u (B, L-1, W), sample_u (B,))
            u = row_uniforms(self.seed, self.draws, (L - 1) * W + 1)
            B = u.shape[0]
            uniforms = (u[:, 1:].reshape(B, L - 1, W), u[:, 0].contiguous())
            self.draws.add_(1)
        return decode_step(self.target, drafter, self.state, beam_width=W, beam_length=L, ops=ops,
                           sampling=self.sampling, uniforms=uniforms, lookup=self.lookup)
