"""The KV handoff through CUDA IPC, one copy: the decode worker reads the prefill worker's pool.

Both workers sit on one GPU. At start the prefill worker sends its pool — the paged cache's one
tensor [L, NB+1, BS, 2, KV, D], allocated once — over the link; torch's reducer shares it with
cudaIpcGetMemHandle and the decode worker maps it. Per request only a few numbers travel:

    prefill:  ("kv", Arrival(meta, its blocks, event, t0))  ──▶  decode
    decode:   its own blocks allocated, copy_blocks(prefill pool → own pool)  ──("done", rid)──▶  prefill

The interprocess event is recorded on the prefill worker's stream after the step that wrote the
blocks. The decode worker's copy (:func:`dispatch.kernels.block_copy.copy_blocks`, every layer in
one launch) runs on its own stream after that event and after its own stream's work so far (the
blocks it just allocated may still be read there); its stream then waits for the copy before any
step reads the blocks. "done" goes once the copy has finished (its event queried). Until then the
prefill worker holds the request's blocks — a reference in its allocator, so they are neither
freed nor handed to another prompt (a prompt that needs them waits) — for at most ``max_inflight``
requests at once.

A handoff's seconds run from ``t0`` (the prefill side sent it) to the moment the decode side sees
its copy finished (one machine, one monotonic clock for both processes), waiting for room included.
With CPU tensors the pool sits in shared memory and the copy is synchronous: the tests' stand-in.
"""
from __future__ import annotations

import queue
import time
from collections import deque
from dataclasses import dataclass

import torch

from dispatch.kernels.block_copy import copy_blocks
from dispatch.serve.blocks import BlockTable
from dispatch.serve.handoff import HandoffMeta


class LinkTimeout(TimeoutError):
    """The other worker sent nothing on the link within the timeout (it is gone or stuck)."""


@dataclass(frozen=True)
class Arrival:
    """One request's handoff as the decode side learns it."""

    meta: HandoffMeta
    blocks: tuple[int, ...]  # the prompt's blocks in the prefill pool, in token order
    event: torch.cuda.Event | None  # recorded after the prefill step wrote them (None on CPU)
    t0: float  # time.perf_counter() when the prefill side sent it


def block_bytes(kv: torch.Tensor) -> int:
    """Bytes of one block over every layer of pool ``kv`` [L, NB+1, BS, 2, KV, D]."""
    return kv[:, 0].numel() * kv.element_size()


class PoolSender:
    """The prefill side. ``link`` = (to_decode, to_prefill) queues; ``kv`` its pool, shared at once."""

    def __init__(self, link, kv: torch.Tensor, free, *, max_inflight: int, timeout_s: float):
        self.tx, self.rx = link
        self.free, self.max_inflight, self.timeout_s = free, max_inflight, timeout_s  # free(BlockTable)
        self.held: dict[int, tuple[BlockTable, torch.cuda.Event | None]] = {}  # router id → hold, event
        self.cuda = kv.is_cuda
        if not kv.is_cuda:
            kv.share_memory_()  # the CPU stand-in: the pool in shared memory, in place
        self.tx.put(("pool", kv))

    @property
    def full(self) -> bool:
        return len(self.held) >= self.max_inflight

    def send(self, meta: HandoffMeta, hold: BlockTable) -> None:
        """Hand off ``meta``'s prompt: ``hold`` is a table holding its blocks (freed on "done")."""
        event = None
        if self.cuda:
            event = torch.cuda.Event(interprocess=True)
            event.record()
        self.held[meta.rid] = (hold, event)  # the event lives until the decode side is done with it
        self.tx.put(("kv", Arrival(meta, tuple(hold.blocks), event, time.perf_counter())))

    def settle(self, wait: float = 0.0) -> int:
        """Free the blocks of every request the decode side has said "done" for; waits up to ``wait``
        seconds for the first when none is there. Returns how many were freed."""
        n = 0
        while True:
            try:
                msg = self.rx.get(timeout=wait) if wait > 0 and n == 0 else self.rx.get_nowait()
            except queue.Empty:
                return n
            kind, rid = msg
            if kind != "done" or rid not in self.held:
                raise RuntimeError(f"the decode worker said {kind!r} for request {rid}, which has no handoff held")
            self.free(self.held.pop(rid)[0])
            n += 1

    def wait_room(self) -> None:
        """Until fewer than ``max_inflight`` handoffs are held; LinkTimeout after timeout_s without a "done"."""
        while self.full:
            if not self.settle(self.timeout_s):
                raise LinkTimeout(f"no 'done' from the decode worker within {self.timeout_s:g} s "
                                  f"({len(self.held)} handoffs held)")


class PoolReceiver:
    """The decode side: maps the prefill pool from the link's first message, copies from it into ``kv``."""

    def __init__(self, link, kv: torch.Tensor):
        self.rx, self.tx = link
        self.kv, self.pool, self.stream = kv, None, None
        self.copying: deque[tuple[Arrival, int, torch.cuda.Event | None]] = deque()

    def arrivals(self) -> list[Arrival]:
        """The handoffs sent since the last call, in order (never waits)."""
        out = []
        while True:
            try:
                kind, x = self.rx.get_nowait()
            except queue.Empty:
                return out
            if kind == "pool":
                self.pool = x
            elif kind == "kv" and self.pool is not None:
                out.append(x)
            else:
                raise RuntimeError(f"the link's first message is the pool, then handoffs; got {kind!r}")

    def copy(self, a: Arrival, plan: list[tuple[int, int]]) -> None:
        """Copy ``a``'s blocks into this pool as ``plan`` says ((prompt block, own block) pairs, see
        :func:`dispatch.serve.handoff.handoff_plan`); "done" goes from :meth:`settle` once it finished."""
        src, dst = [a.blocks[i] for i, _ in plan], [d for _, d in plan]
        nbytes = len(plan) * block_bytes(self.kv)
        if not self.kv.is_cuda:
            copy_blocks(self.pool, self.kv, src, dst)
            self.copying.append((a, nbytes, None))
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.kv.device)
        main = torch.cuda.current_stream(self.kv.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(a.event)
            copy_blocks(self.pool, self.kv, src, dst)
            copied = torch.cuda.Event()
            copied.record()
        main.wait_event(copied)
        self.copying.append((a, nbytes, copied))

    def settle(self) -> list[tuple[HandoffMeta, int, float]]:
        """(meta, bytes, seconds) of every copy finished since the last call, in order; the prefill
        side is told "done" for each (its blocks free again)."""
        out = []
        while self.copying and (self.copying[0][2] is None or self.copying[0][2].query()):
            a, nbytes, _ = self.copying.popleft()
            self.tx.put(("done", a.meta.rid))
            out.append((a.meta, nbytes, time.perf_counter() - a.t0))
        return out
