"""Continuous batching: which sequences run in the next step, and how many of their tokens.

    waiting (FIFO, bounded) ──admit when blocks allow──▶ running ──finished──▶ blocks freed
        ▲                                                   │
        └──────────── preempted (blocks freed, recomputed) ─┘

Every step (:meth:`Scheduler.schedule`) fills a budget of ``max_step_tokens`` tokens:

1. running sequences that are decoding take one token each (they go first: time per output token
   stays steady while prompts arrive);
2. running sequences still in their prompt take the next chunk of it, as much as the budget left
   allows (chunked prefill: a long prompt is split over several steps and rides along with the
   decode rows instead of stalling them);
3. waiting sequences are admitted in arrival order while the budget, ``max_seqs`` and the free
   blocks allow: their blocks for the whole prompt are taken at once (prefix-cache hits shared), and
   their first chunk joins the step.

A decoding sequence whose next token needs a new block when none is free preempts the sequence
admitted last (it may be itself): the victim's blocks are freed and it goes back to the front of the
waiting queue, to be recomputed from its prompt and the tokens it already produced — nothing is lost
and nothing crashes. A single sequence always fits alone (the engine refuses a request longer than
the cache), so the oldest running sequence always makes progress.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from dispatch.serve.blocks import BlockAllocator, BlockTable


@dataclass(frozen=True)
class SchedulerConfig:
    """``max_seqs`` running at once; ``max_step_tokens`` per step (decode rows + prefill chunks);
    ``max_waiting`` queued before :class:`QueueFull`; ``chunked_prefill`` off: a prompt runs whole,
    in one step (admitted only when it fits in the budget, or alone)."""

    max_seqs: int = 64
    max_step_tokens: int = 512
    max_waiting: int = 1024
    chunked_prefill: bool = True

    def __post_init__(self):
        for name in ("max_seqs", "max_step_tokens", "max_waiting"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")


class QueueFull(RuntimeError):
    """The waiting queue holds ``max_waiting`` requests (the server answers 429)."""


@dataclass(eq=False)
class Sequence:
    """One request's state. ``tokens`` = prompt + generated; the first ``computed`` have K/V in the
    cache; ``table`` its blocks. ``done`` once finished or aborted (blocks already returned)."""

    id: int
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    computed: int = 0
    table: BlockTable = field(default_factory=BlockTable)
    done: bool = False
    preemptions: int = 0

    def __post_init__(self):
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def output(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def left(self) -> int:
        """Tokens not yet computed (1 while decoding: the last sampled token)."""
        return len(self.tokens) - self.computed


@dataclass
class Scheduled:
    """One step: ``decode`` sequences (one token each), then ``chunks`` (sequence, n tokens)."""

    decode: list[Sequence] = field(default_factory=list)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decode) + sum(n for _, n in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.decode or self.chunks)


class Scheduler:
    """Waiting and running queues over one :class:`BlockAllocator` (see the module docstring)."""

    def __init__(self, cfg: SchedulerConfig, allocator: BlockAllocator):
        self.cfg, self.alloc = cfg, allocator
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # blocks kept free at admission (unless nothing runs) so the running rows can grow a while
        self.watermark = max(1, allocator.num_blocks // 100)

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.cfg.max_waiting:
            raise QueueFull(f"{len(self.waiting)} requests waiting (max_waiting={self.cfg.max_waiting})")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, seq: Sequence) -> None:
        self.alloc.free(seq.table)
        seq.computed = 0
        seq.preemptions += 1
        self.running.remove(seq)
        self.waiting.appendleft(seq)

    def schedule(self) -> Scheduled:
        """The next step's sequences (see the module docstring); may preempt, never raises."""
        out, budget, gone = Scheduled(), self.cfg.max_step_tokens, set()  # gone: ids preempted just now
        bs = self.alloc.block_size
        for seq in list(self.running):  # 1. decode rows, oldest first
            n = len(seq.tokens)
            if n - seq.computed != 1 or budget == 0 or seq.id in gone:
                continue
            while n > len(seq.table.blocks) * bs and not self.alloc.grow(seq.table, n):  # a new block, if due
                victim = self.running[-1]
                self._preempt(victim)
                gone.add(victim.id)
                out.preempted.append(victim)
                if victim in out.decode:
                    out.decode.remove(victim)
                    budget += 1
                if victim is seq:
                    break
            if seq.id not in gone:
                out.decode.append(seq)
                budget -= 1
        for seq in self.running:  # 2. prompts in progress (their blocks are taken at admission)
            if budget > 0 and len(seq.tokens) - seq.computed > 1:
                n = self._chunk(seq, budget, alone=not out)
                if n:
                    out.chunks.append((seq, n))
                    budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_seqs:  # 3. admissions
            seq = self.waiting[0]
            n = self._chunk(seq, budget, alone=not out)
            room = self.alloc.free_after(seq.tokens)  # blocks left free once its prompt is in
            if not n or room < 0 or (self.running and room < self.watermark):
                break  # arrival order: the head waits for room, nobody overtakes it
            seq.table, seq.computed = self.alloc.allocate(seq.tokens)
            n = self._chunk(seq, budget, alone=not out)  # the cached prefix shortened the prompt
            self.waiting.popleft()
            self.running.append(seq)
            out.chunks.append((seq, n))
            budget -= n
        return out

    def _chunk(self, seq: Sequence, budget: int, alone: bool) -> int:
        """Tokens of ``seq``'s prompt to compute this step: all that is left, or up to the budget when
        chunking; 0 when unchunked and it does not fit (unless the step would be empty otherwise)."""
        left = seq.left
        if self.cfg.chunked_prefill:
            return min(left, budget)
        return left if left <= budget or alone else 0

    def finish(self, seq: Sequence) -> None:
        """Retire ``seq`` wherever it is (finished, aborted, disconnected): its blocks return now."""
        if seq.done:
            return
        seq.done = True
        self.alloc.free(seq.table)
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def after_step(self, step: Scheduled) -> list[Sequence]:
        """Advance ``computed`` by what ran; commit full blocks to the prefix cache. Returns the
        sequences that now need a new token (caught up with their tokens)."""
        ready, commit = [], self.alloc.commit
        for seq in step.decode:
            if not seq.done:
                seq.computed += 1
                commit(seq.table, seq.tokens, seq.computed)
                ready.append(seq)  # a decode row computed its one token left
        for seq, n in step.chunks:
            if not seq.done:
                seq.computed += n
                commit(seq.table, seq.tokens, seq.computed)
                if seq.computed == len(seq.tokens):
                    ready.append(seq)
        return ready
