"""The KV handoff between a prefill worker and a decode worker: which blocks, packed how, sent how.

After its prompt is computed, a request's K/V sit in the prefill worker's pool in the blocks of its
table. The decode worker needs them in blocks of *its* pool. The handoff copies the prompt's blocks
(``cdiv(n_prompt, BS)`` of them, in token order) into one contiguous tensor
[L, nb, BS, 2, KV, D], sends it as one message, and scatters it into the decode side's blocks:

    prefill pool  ──gather(table.blocks)──▶  payload [L, nb, BS, 2, KV, D]  ──send──▶  staging
    staging  ──scatter(plan)──▶  decode pool (only the blocks the decode side did not already hold)

With blocks of 4 and a 10-token prompt in prefill blocks [7, 2, 5], the payload holds those three
blocks in that order; a decode table [3, 9, 4] whose first block came from its prefix cache takes
payload blocks 1 and 2 into blocks 9 and 4: ``handoff_plan(10, 4, [3, 9, 4], cached_tokens=4)`` =
``[(1, 9), (2, 4)]``.

Sending: a thread of the sending worker posts ``isend`` and waits on it, one payload after another,
while the worker's main loop goes on with the next prefill (the gather is the only part on the
main loop); the receiving worker's thread posts ``irecv`` into a staging tensor for each handoff
it has been told about, in the same order, and hands the landed ones to the decode loop. gloo for
CPU tensors, NCCL for GPU tensors (NCCL ignores tags and matches by order; so does this protocol).
Every wait is bounded by the process group's timeout. With both workers on one GPU,
:mod:`dispatch.serve.handoff_ipc` moves the same payloads through CUDA IPC instead.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dispatch.serve.blocks import cdiv


@dataclass(frozen=True)
class HandoffMeta:
    """What the decode worker learns about a request before its blocks land (sent beside them)."""

    rid: int
    prompt: tuple[int, ...]
    first: int  # the first generated token (sampled by the prefill worker)
    params: dict  # RequestParams fields
    n_blocks: int
    gen_state: torch.Tensor | None = None  # a sampled request's generator, after its first draw

    @property
    def tag(self) -> int:
        return self.rid % (1 << 20)


def handoff_plan(n_prompt: int, block_size: int, dst_blocks: list[int], cached_tokens: int = 0
                 ) -> list[tuple[int, int]]:
    """(payload block, decode block) pairs to write, in token order: every block of the prompt's
    ``cdiv(n_prompt, block_size)`` except the ``cached_tokens // block_size`` leading ones the decode
    side already holds (its prefix cache).

    >>> handoff_plan(10, 4, [3, 9, 4], cached_tokens=4)
    [(1, 9), (2, 4)]
    """
    if n_prompt < 1 or block_size < 1:
        raise ValueError(f"n_prompt and block_size must be positive, got {n_prompt}, {block_size}")
    nb = cdiv(n_prompt, block_size)
    if len(dst_blocks) != nb:
        raise ValueError(f"{n_prompt} tokens in blocks of {block_size} need {nb} decode blocks, got {len(dst_blocks)}")
    if cached_tokens % block_size or not 0 <= cached_tokens < n_prompt:
        raise ValueError(f"cached_tokens must be whole blocks short of the prompt, got {cached_tokens}")
    return [(i, dst_blocks[i]) for i in range(cached_tokens // block_size, nb)]


def gather(kv: torch.Tensor, blocks: list[int]) -> torch.Tensor:
    """The payload: ``kv`` [L, NB+1, BS, 2, KV, D] at ``blocks``, contiguous [L, nb, BS, 2, KV, D]."""
    idx = torch.tensor(blocks, dtype=torch.long, device=kv.device)
    return kv.index_select(1, idx)


def scatter(kv: torch.Tensor, payload: torch.Tensor, plan: list[tuple[int, int]]) -> None:
    """Write the payload's blocks into ``kv`` as ``plan`` says (see :func:`handoff_plan`)."""
    if not plan:
        return
    src = torch.tensor([s for s, _ in plan], dtype=torch.long, device=kv.device)
    dst = torch.tensor([d for _, d in plan], dtype=torch.long, device=kv.device)
    kv.index_copy_(1, dst, payload.index_select(1, src))


class Mover:
    """A thread that sends (``peer`` is the destination) or receives payloads one at a time, in the
    order they are queued; ``error`` holds the exception that stopped it (the worker re-raises it)."""

    def __init__(self, peer: int, *, send: bool, on_done):
        self.peer, self.send, self.on_done = peer, send, on_done
        self.todo: queue.SimpleQueue = queue.SimpleQueue()
        self.error: BaseException | None = None
        self.busy = 0  # queued or in flight
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=f"kv-{'send' if send else 'recv'}", daemon=True)
        self.thread.start()

    def put(self, meta: HandoffMeta, tensor: torch.Tensor) -> None:
        """Queue ``tensor``'s move; on a GPU an event marks the point of the worker's stream it waits for."""
        ready = torch.cuda.Event() if tensor.is_cuda else None
        if ready is not None:
            ready.record()
        with self._lock:
            self.busy += 1
        self.todo.put((meta, tensor, ready))

    def stop(self) -> None:
        self.todo.put(None)

    def _run(self) -> None:
        try:
            while (item := self.todo.get()) is not None:
                meta, t, ready = item
                if t.is_cuda:  # this thread's current device: the worker's GPU, not cuda:0
                    torch.cuda.set_device(t.device)
                self.on_done(meta, t, self._move(meta, t, ready))
                with self._lock:
                    self.busy -= 1
        except BaseException as e:  # noqa: BLE001 - the worker's loop reports it
            self.error = e

    def _move(self, meta: HandoffMeta, t: torch.Tensor, ready) -> float:
        """Send or receive ``t``; its seconds. Posted on this thread's stream, the default one: after ``ready``."""
        t0 = time.perf_counter()
        op = dist.isend if self.send else dist.irecv
        op(t, self.peer, tag=meta.tag).wait()  # bounded by the group's timeout
        if t.is_cuda:
            torch.cuda.current_stream(t.device).synchronize()
        return time.perf_counter() - t0
