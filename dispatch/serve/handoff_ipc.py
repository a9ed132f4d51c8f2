"""The KV handoff through CUDA IPC: both workers on one GPU, a ring of staging slots between them.

The prefill worker allocates the ring once, [slots, L, max_nb, BS, 2, KV, D] on its GPU, and sends
it once over the link to the decode worker (torch's reducer shares it with cudaIpcGetMemHandle; the
decode worker maps it). Per request only a few numbers travel over the link's two queues:

    prefill:  payload ──copy──▶ ring[slot]     ──("kv", rid, slot, nb, t0)──▶  decode
    decode:   ring[slot] ──copy──▶ staging     ──slot──▶  prefill (the slot is free again)

A slot is written only when the decode worker has handed it back (the prefill worker waits for one
when all are out), and a side's message goes only after its copy has finished (its side stream
synchronized), so neither copy sees half of the other's. Each copy runs on the side's own stream,
after an event recorded when the tensor was queued (the gather on the prefill side, the staging
tensor's allocation on the decode side): it never races the worker's own stream. The ring lives as
long as the prefill worker, as CUDA IPC needs of the memory's producer.

The handoff's time runs from the moment the prefill side holds a slot to the end of the decode
side's copy (one machine, one monotonic clock for both processes); the decode side reports it.
With CPU tensors and in-process queues the same classes run without a GPU (the tests' stand-in).
"""
from __future__ import annotations

import queue
import time
from collections import deque

import torch

from dispatch.serve.handoff import HandoffMeta, Mover


class LinkTimeout(TimeoutError):
    """The other worker sent nothing on the link within the timeout (it is gone or stuck)."""


def make_ring(kv: torch.Tensor, slots: int, max_blocks: int) -> torch.Tensor:
    """The staging ring for pool ``kv`` [L, NB+1, BS, 2, KV, D]: [slots, L, max_blocks, BS, 2, KV, D]."""
    if slots < 1 or max_blocks < 1:
        raise ValueError(f"slots and max_blocks must be positive, got {slots}, {max_blocks}")
    return kv.new_empty((slots, kv.shape[0], max_blocks, *kv.shape[2:]))


class IpcMover(Mover):
    """:class:`Mover`'s interface over a staging ring. ``link`` = (to_decode, to_prefill) queues. The
    sending side passes its ``ring`` (sent on the link at once); the receiving side maps it from the
    link's first message. ``on_done(meta, tensor, seconds)``: seconds of the whole handoff on the
    receiving side, of the copy into the ring on the sending side."""

    def __init__(self, link, *, send: bool, on_done, timeout_s: float, ring: torch.Tensor | None = None):
        if send == (ring is None):
            raise ValueError("the sending side passes its ring, the receiving side none")
        self.tx, self.rx = link if send else link[::-1]  # (what this side writes, what it reads)
        self.ring, self.timeout_s, self.stream = ring, timeout_s, None
        self.free = deque(range(ring.shape[0])) if send else None
        if send:
            if not ring.is_cuda:
                ring.share_memory_()  # the CPU stand-in: in shared memory before a copy lands in it
            self.tx.put(("ring", ring))
        super().__init__(-1, send=send, on_done=on_done)

    def _get(self, q, what: str):
        try:
            return q.get(timeout=self.timeout_s)
        except queue.Empty:
            raise LinkTimeout(f"no {what} from the {'decode' if self.send else 'prefill'} worker within "
                              f"{self.timeout_s:g} s") from None

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, ready) -> None:
        if not dst.is_cuda:
            dst.copy_(src)
            return
        if self.stream is None:
            self.stream = torch.cuda.Stream(dst.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            dst.copy_(src)
        self.stream.synchronize()  # the copy is done before the other side hears of it

    def _move(self, meta: HandoffMeta, t: torch.Tensor, ready) -> float:
        if self.send:
            slot = self.free.popleft() if self.free else self._get(self.rx, "slot handed back")
            t0 = time.perf_counter()
            nb = t.shape[1]
            self._copy(self.ring[slot, :, :nb], t, ready)
            self.tx.put(("kv", meta.rid, slot, nb, t0))
            return time.perf_counter() - t0
        if self.ring is None:
            kind, self.ring = self._get(self.rx, "staging ring")
            if kind != "ring":
                raise RuntimeError(f"the link's first message is the ring, got {kind!r}")
        kind, rid, slot, nb, t0 = self._get(self.rx, f"KV blocks of request {meta.rid}")
        if (kind, rid, nb) != ("kv", meta.rid, t.shape[1]):
            raise RuntimeError(f"handoff out of order: expected request {meta.rid}'s {t.shape[1]} blocks, "
                               f"got {kind!r} {rid}'s {nb}")
        self._copy(t, self.ring[slot, :, :nb], ready)
        self.tx.put(slot)
        return time.perf_counter() - t0
