"""A timeline of a decode launch: which SM ran each work item, and when (chapter 3's kernels).

The decode kernels deal (expert, tile) items to a grid of programs (:mod:`dispatch.kernels.gemv`). How
long the launch takes depends on how those items land on the SMs: a program that gets one item more
than the others, or an SM whose programs finish early while others still stream, leaves bandwidth
unused at the end. To see it, a kernel that takes ``TRACE: tl.constexpr`` and ``trace_ptr`` writes
one int64 row per item it runs:

    [SM, program, kind, start, end]     kind 0: an up item, 1: a down item, 2: a split item,
                                        3: a reduce item (:mod:`dispatch.kernels.decode_split`);
                                        start, end: the GPU's nanosecond clock (``%globaltimer``)

at row ``item`` (the one-launch kernels: row ``ticket``, and a down or reduce item's time includes
its wait for the items it needs). ``TRACE=False`` compiles to nothing, so the
kernels are the same as without this module. GPU only: the clock and the SM id are read by inline
PTX (Triton's ``tl.extra.cuda.globaltimer`` and ``smid``), which its CPU interpreter cannot run
(:func:`new` refuses elsewhere). ``run_decode(..., trace=[])`` allocates the buffers (:func:`buffers`),
appends them to the list and the kernels fill them; :mod:`dispatch_book.bench.timeline` turns them
into a timeline.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime

COLUMNS = ("sm", "program", "kind", "start_ns", "end_ns")


def new(rows: int, device) -> torch.Tensor:
    """An int64 [rows, 5] trace buffer on ``device``, every row -1 (an item that never ran stays so)."""
    dev = torch.device(device)
    if dev.type != "cuda" or runtime.INTERPRET:
        raise ValueError(f"a trace reads the GPU's clock by inline PTX: it needs a CUDA device without "
                         f"Triton's interpreter, got {dev}{' (interpreting)' if runtime.INTERPRET else ''}")
    return torch.full((rows, len(COLUMNS)), -1, dtype=torch.int64, device=dev)


def buffers(trace: list | None, stand_in: torch.Tensor, *kernels) -> list[torch.Tensor]:
    """A buffer per (name, rows) of ``kernels`` on stand_in's device, each appended to ``trace`` with its
    name (the launchers' ``trace=`` list); without a trace, ``stand_in`` for each (never touched:
    ``TRACE=False``), so an untraced call allocates nothing."""
    if trace is None:
        return [stand_in] * len(kernels)
    bufs = [new(max(rows, 1), stand_in.device) for _, rows in kernels]
    trace.extend((name, b) for (name, _), b in zip(kernels, bufs, strict=True))
    return bufs


@triton.jit
def stamp(TRACE: tl.constexpr):
    """The GPU clock in ns where ``TRACE`` (else 0): the start of an item."""
    t = 0
    if TRACE:
        t = tl.extra.cuda.globaltimer()
    return t


@triton.jit
def record(trace_ptr, row, kind, t0, TRACE: tl.constexpr):
    """Row ``row`` of the trace: this SM, this program, ``kind``, t0 and now (``TRACE`` only)."""
    if TRACE:
        tl.debug_barrier()  # every thread of the program has finished the item
        t1 = tl.extra.cuda.globaltimer()
        base = trace_ptr + row.to(tl.int64) * 5
        tl.store(base, tl.extra.cuda.smid())  # stored as the buffer's int64
        tl.store(base + 1, tl.program_id(0))
        tl.store(base + 2, kind)
        tl.store(base + 3, t0)
        tl.store(base + 4, t1)
