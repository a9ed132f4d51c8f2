"""Programmatic dependent launch (PDL, Hopper and later): the next kernel starts while this one drains.

A decode step is ~200 small kernels in a row (chapter 6). Each one normally starts only after the
previous one has finished and its memory is flushed, then pays its own launch and ramp-up: a few
µs that the weights' read time does not hide at one token. With PDL a kernel launched with the
``launch_pdl`` attribute may be scheduled as soon as every program of the kernel before it has
executed ``griddepcontrol.launch_dependents``; its programs then wait, resident on the SMs, in
``griddepcontrol.wait`` until the previous kernel has completed and flushed its memory. What a
program does before the wait must not touch memory that an earlier kernel writes or reads:
here that is only the weights (never written during inference) — :func:`dispatch.kernels.dense_gemv`
issues its first weight load before the wait.

Every kernel of the decode step takes ``PDL: tl.constexpr`` and calls :func:`pdl_wait` (or
:func:`pdl_enter`) before its first access to activations; the launchers pass ``**launch_kw(device)``.
Where the next kernel is released matters. ``PDL = 1`` releases it at the start (:func:`pdl_enter`):
right for the short kernels of the step (norms, rope, attention, the GEMVs, routing, the sort's three
kernels). ``PDL = 2`` (``launch_kw(device, late=True)``) releases it at the end (:func:`pdl_exit`): the
decode experts kernels and the grouped GEMM's, which run for several waves of programs: released early,
the next kernel's waiting programs would occupy SM slots that the current kernel's later waves need.
The kernels race and the end-to-end benchmark time the paths with and without PDL in one run
(``ours_no_pdl``); chapters 3 and 6 read those recordings.

Off (``PDL=False``, no attribute) on CPU and under the interpreter, before sm_90, on a Triton
without ``launch_pdl``, with ``DISPATCH_PDL=0`` in the environment, and inside :func:`disabled`
(benchmarks race the step with and without it). Results are bitwise the same either way: only when a
kernel starts changes, never what it computes.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch
import triton
import triton.language as tl

from dispatch import runtime

_off = 0  # depth of open disabled() blocks


@functools.lru_cache(maxsize=None)
def _triton_has_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions

        return "launch_pdl" in CUDAOptions.__dataclass_fields__ and hasattr(tl.extra.cuda, "gdc_wait")
    except (ImportError, AttributeError):
        return False


@functools.lru_cache(maxsize=None)
def _hardware(index: int) -> bool:
    """sm_90+ and a Triton that launches with PDL (read once per device: launchers ask on every call)."""
    return torch.cuda.get_device_capability(index) >= (9, 0) and _triton_has_pdl()


def enabled(device) -> bool:
    """Whether kernels on ``device`` launch with PDL now (see the module docstring for when not)."""
    if _off or runtime.INTERPRET or os.environ.get("DISPATCH_PDL", "1") == "0":
        return False
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type != "cuda":
        return False
    return _hardware(dev.index if dev.index is not None else torch.cuda.current_device())


def _skipped() -> bool:
    """Whether the launcher calling :func:`launch_kw` lives in a module ``DISPATCH_PDL_SKIP`` names."""
    skip = os.environ.get("DISPATCH_PDL_SKIP")
    return bool(skip) and sys._getframe(2).f_globals.get("__name__", "").rsplit(".", 1)[-1] in skip.split(",")


def launch_kw(device, late: bool = False) -> dict:
    """The launch keywords of a kernel that takes ``PDL``: the constexpr, and the attribute when on."""
    if not enabled(device) or _skipped():
        return {"PDL": False}
    return {"PDL": 2 if late else 1, "launch_pdl": True}


@contextlib.contextmanager
def disabled():
    """Launch without PDL inside this block (a CUDA graph captured here keeps plain launches)."""
    global _off
    _off += 1
    try:
        yield
    finally:
        _off -= 1


@triton.jit
def pdl_release(PDL: tl.constexpr):
    """Let the next kernel's programs be scheduled once every program here has passed this point."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_wait(PDL: tl.constexpr):
    """Block until the kernels before this one have completed and their writes are visible."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """At a kernel's start: release the next kernel (``PDL`` 1/True; 2 releases in :func:`pdl_exit`),
    then wait for the previous one."""
    if PDL == 1:
        pdl_release(PDL)
    pdl_wait(PDL)


@triton.jit
def pdl_exit(PDL: tl.constexpr):
    """At a kernel's end: release the next kernel where ``PDL`` is 2 (late release)."""
    if PDL == 2:
        pdl_release(PDL)
