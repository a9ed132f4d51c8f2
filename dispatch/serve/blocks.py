"""The paged KV cache's bookkeeping: fixed-size blocks, a block table per sequence, prefix caching.

The cache is one pool of ``num_blocks`` blocks of ``block_size`` token slots each (the tensors live
in :mod:`dispatch.serve.runner`). A sequence owns a :class:`BlockTable`: the list of its blocks, in
order, so token position p sits in slot ``blocks[p // block_size] * block_size + p % block_size``.
A sequence of n tokens holds ``cdiv(n, block_size)`` blocks: at most ``block_size - 1`` slots of
waste per sequence, whatever the lengths of the others (a static cache reserves max_seq per row).

Prefix caching: once every token of a full block has been computed, the block gets a hash of its
tokens chained with the hash of the block before it, so a hash names the whole prefix up to the
block's end. A new sequence whose prompt starts with the same full blocks takes those blocks (their
reference count goes up) instead of new ones, and skips computing their tokens. A block whose count
drops to 0 goes to the free list but keeps its hash: it can still be hit until it is handed out for
other tokens (least recently freed first). A sequence's last prompt token is always computed (its
logits pick the first new token), so the block holding it is never taken from the cache.

Invariants (tested with random operations): a block's count is the number of tables holding it; the
free list is exactly the blocks of count 0; a hashed block's tokens are the ones its hash names;
after every table is freed, every block is free again. Nothing is ever lost: :meth:`free` is the
only way out of a table, and the engine calls it on finish, abort, disconnect and preemption.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class BlockTable:
    """One sequence's blocks, in token order; ``hashes[i]`` is block i's prefix hash once it is full
    and computed (``len(hashes) <= len(blocks)``)."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)


class NoFreeBlocks(RuntimeError):
    """Not enough free blocks (the scheduler checks first: it preempts or waits, never crashes)."""


class BlockAllocator:
    """``num_blocks`` blocks of ``block_size`` slots; reference counts; a prefix cache by block hash."""

    def __init__(self, num_blocks: int, block_size: int, *, prefix_caching: bool = True):
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.num_blocks, self.block_size, self.prefix_caching = num_blocks, block_size, prefix_caching
        self.refs = [0] * num_blocks
        self.free_ids: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.hash_of: list[int | None] = [None] * num_blocks  # the prefix hash a block holds, if any
        self.tokens_of: list[tuple[int, ...] | None] = [None] * num_blocks  # its tokens (hash collisions)
        self.by_hash: dict[int, int] = {}
        self.hits = self.queries = 0  # prefix-cache tokens hit / asked for (for /metrics)

    # ---- counts ----
    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self.free_ids)

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks a sequence of ``n_tokens`` tokens holds."""
        return cdiv(n_tokens, self.block_size)

    # ---- the prefix cache ----
    @staticmethod
    def chain(parent: int | None, tokens) -> int:
        """The hash of a full block of ``tokens`` that follows the block hashed ``parent``."""
        return hash((parent, tuple(tokens)))

    def cached_prefix(self, tokens: list[int]) -> list[int]:
        """Blocks of the cache that hold ``tokens``' leading full blocks (never the block of the last
        token), in order; takes no reference."""
        if not self.prefix_caching:
            return []
        hits, parent, bs = [], None, self.block_size
        for i in range((len(tokens) - 1) // bs):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            parent = self.chain(parent, chunk)
            b = self.by_hash.get(parent)
            if b is None or self.tokens_of[b] != chunk:
                break
            hits.append(b)
        return hits

    def _take(self) -> int:
        """A free block for new tokens: the least recently freed; its old hash (if any) is dropped."""
        if not self.free_ids:
            raise NoFreeBlocks("no free KV block")
        b, _ = self.free_ids.popitem(last=False)
        h = self.hash_of[b]
        if h is not None:
            if self.by_hash.get(h) == b:
                del self.by_hash[h]
            self.hash_of[b] = self.tokens_of[b] = None
        self.refs[b] = 1
        return b

    def _ref(self, b: int) -> None:
        if self.refs[b] == 0:
            del self.free_ids[b]
        self.refs[b] += 1

    # ---- tables ----
    def free_after(self, tokens: list[int], n_tokens: int | None = None) -> int:
        """Free blocks left after :meth:`allocate` of ``n_tokens`` (default: all) of ``tokens``
        (negative: it does not fit)."""
        n = len(tokens) if n_tokens is None else n_tokens
        hits = self.cached_prefix(tokens[:n])
        free_hits = sum(1 for b in hits if self.refs[b] == 0)  # hits that sit in the free list
        return self.num_free - free_hits - (self.blocks_for(n) - len(hits))

    def can_allocate(self, tokens: list[int], n_tokens: int | None = None) -> bool:
        """Whether :meth:`allocate` of ``n_tokens`` (default: all) of ``tokens`` would succeed."""
        return self.free_after(tokens, n_tokens) >= 0

    def allocate(self, tokens: list[int], n_tokens: int | None = None) -> tuple[BlockTable, int]:
        """A table covering the first ``n_tokens`` (default: all) of ``tokens``: cached prefix blocks
        shared, the rest new. Returns (table, tokens already computed). NoFreeBlocks, with nothing
        taken, if it does not fit."""
        n = len(tokens) if n_tokens is None else n_tokens
        if not 1 <= n <= len(tokens):
            raise ValueError(f"n_tokens must lie in [1, {len(tokens)}], got {n}")
        if not self.can_allocate(tokens, n):
            raise NoFreeBlocks(f"{self.blocks_for(n)} blocks asked for, {self.num_free} free")
        hits = self.cached_prefix(tokens[:n])
        table = BlockTable()
        for b in hits:
            self._ref(b)
            table.blocks.append(b)
            table.hashes.append(self.hash_of[b])
        while len(table.blocks) < self.blocks_for(n):
            table.blocks.append(self._take())
        cached = len(hits) * self.block_size
        self.hits += cached
        self.queries += n
        return table, cached

    def share(self, blocks: list[int]) -> BlockTable:
        """A table holding ``blocks`` (each taken once more): they stay out of the free list until it is freed."""
        for b in blocks:
            if self.refs[b] <= 0:
                raise RuntimeError(f"block {b} is free: only a held block can be shared")
            self._ref(b)
        return BlockTable(list(blocks))

    def grow(self, table: BlockTable, n_tokens: int) -> bool:
        """Add blocks so ``table`` covers ``n_tokens``; False (and nothing taken) if too few are free."""
        need = self.blocks_for(n_tokens) - len(table.blocks)
        if need > self.num_free:
            return False
        for _ in range(need):
            table.blocks.append(self._take())
        return True

    def commit(self, table: BlockTable, tokens: list[int], n_computed: int) -> None:
        """Hash the table's blocks that are full and computed (their K/V written): from now on a new
        sequence with the same prefix can take them."""
        bs = self.block_size
        if not self.prefix_caching or n_computed // bs <= len(table.hashes):  # nothing newly full: most steps
            return
        for i in range(len(table.hashes), min(n_computed // bs, len(table.blocks))):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            h = self.chain(table.hashes[-1] if table.hashes else None, chunk)
            table.hashes.append(h)
            b = table.blocks[i]
            if h not in self.by_hash:  # the first block to hold this prefix serves it
                self.by_hash[h], self.hash_of[b], self.tokens_of[b] = b, h, chunk

    def free(self, table: BlockTable) -> None:
        """Give back every block of ``table`` (last block first: the tail of a prefix is evicted
        before its head) and empty it. Freeing an empty table does nothing."""
        for b in reversed(table.blocks):
            if self.refs[b] <= 0:
                raise RuntimeError(f"block {b} freed more often than taken")
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_ids[b] = None
        table.blocks.clear()
        table.hashes.clear()

    def check(self) -> None:
        """Raise AssertionError unless the bookkeeping is consistent (tests; cheap enough for CI)."""
        assert all(r >= 0 for r in self.refs), "negative reference count"
        assert set(self.free_ids) == {b for b, r in enumerate(self.refs) if r == 0}, "free list != count-0 blocks"
        for h, b in self.by_hash.items():
            assert self.hash_of[b] == h and self.tokens_of[b] is not None, f"block {b}: hash map out of step"
