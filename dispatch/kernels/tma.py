"""The Tensor Memory Accelerator (TMA, Hopper and later): a tile copied by the hardware, not by threads.

With pointer loads every thread of a program computes the addresses of its share of a
[BLOCK_N, BLOCK_K] weight tile and starts its own copies (``cp.async``, 16 bytes each), masks
included. A TMA load hands the copy engine a *descriptor* — the tensor's base, shape and strides
and the tile (box) shape, encoded once on the host — plus the tile's coordinates; one thread starts
it, the engine writes the tile into shared memory in the swizzled layout the tensor cores read, and
fills zeros beyond the tensor's edge. The warps spend their instruction slots on the MMAs instead.

What it is worth is measured, not assumed: the kernels race (``python -m dispatch_book.bench
kernels``) times the grouped path with and without it (``ours_no_tma``) at every size, and chapter 2
reads that recording. TMA pays where tiles are large and the MMAs many; thin blocks of few rows are
bound by reading weights, where the threads' own copies keep up, hence ``MIN_BLOCK_M``.

The grouped GEMM (chapter 2) loads its weight tiles this way, and the down kernel its h tiles (h is
in slot order, so a block's rows are one box); the up kernel's activations stay pointer loads: they
are gathered row by row through the sort, and a Hopper box is a dense rectangle. Same tiles, same
K order, same MMAs: results are bitwise those of the pointer loads.

Quantized experts (chapter 7) come the same way: their 8-bit codes (a 128-code chunk is one
128-byte box row) and, in w8a8, down's fp8 h codes; the scales stay pointer loads.

Where: sm_90+, bf16/fp16 weights or 8-bit codes, tiles of at least
``MIN_BLOCK_M`` rows (the large batches the grouped path runs), and tensors a descriptor can
describe (:func:`describable`). Off under the interpreter unless :func:`forced` (tests: the
interpreter runs descriptor loads), before sm_90 (forced or not), on a Triton without host descriptors,
with ``DISPATCH_TMA=0`` in the environment, and inside :func:`disabled` (benchmarks race both).
"""
from __future__ import annotations

import contextlib
import functools
import os

import torch

from dispatch import runtime

MIN_BLOCK_M = 64  # the grouped GEMM's large-batch tiles (block_m 64/128); smaller blocks keep pointer loads
_mode = ["auto"]  # "auto" | "off" (disabled) | "on" (forced: the interpreter too)


@functools.lru_cache(maxsize=None)
def _triton_has_descriptors() -> bool:
    try:
        from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _hopper(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def enabled(device) -> bool:
    """Whether launches on ``device`` may use TMA now (see the module docstring for when not)."""
    device = torch.device(device)
    if _mode[0] == "off" or os.environ.get("DISPATCH_TMA") == "0" or not _triton_has_descriptors():
        return False
    if device.type == "cuda" and not runtime.INTERPRET:
        return _hopper(device.index or 0)  # compiled: the hardware decides, forced or not
    return _mode[0] == "on"  # the interpreter runs descriptor loads on any device: only when forced


@contextlib.contextmanager
def _in_mode(mode: str):
    before, _mode[0] = _mode[0], mode
    try:
        yield
    finally:
        _mode[0] = before


def disabled():
    """Launches inside use pointer loads everywhere (what TMA is worth, measured in one run)."""
    return _in_mode("off")


def forced():
    """Launches inside use TMA under the interpreter too, wherever the tile and tensors allow it (tests;
    a compiled launch still needs sm_90+)."""
    return _in_mode("on")


def rows_view(t) -> torch.Tensor | None:
    """[E, R, C] weights as one [E·R, C] matrix without a copy (expert e's rows at e·R), or None."""
    if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.stride(0) != t.shape[1] * t.stride(1):
        return None
    return t.view(-1, t.shape[2]) if t.stride(2) == 1 else None


TMA_DTYPES = (torch.bfloat16, torch.float16, torch.int8, torch.float8_e4m3fn)  # 16-bit values, 8-bit codes


def describable(t: torch.Tensor | None, box_cols: int) -> bool:
    """A 2-D 16-bit or 8-bit tensor a descriptor can cover: unit column stride, 16-byte aligned base and
    row stride, and a box row of 16 to 128 bytes (one 128-byte swizzle)."""
    if t is None or t.dim() != 2 or t.dtype not in TMA_DTYPES or t.stride(1) != 1:
        return False
    elt = t.element_size()
    return t.data_ptr() % 16 == 0 and (t.stride(0) * elt) % 16 == 0 and 16 <= box_cols * elt <= 128


def descriptors(views, block_m: int, block_n: int, block_k: int, device):
    """TMA descriptors for ``views`` = [(2-D tensor or None, 'm' or 'n')]: boxes of block_m (or block_n)
    rows × block_k columns; None where this launch keeps pointer loads (TMA off, small tiles, or a
    tensor it cannot describe)."""
    if block_m < MIN_BLOCK_M or not enabled(device) or not all(describable(t, block_k) for t, _ in views):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return [TensorDescriptor.from_tensor(t, [block_m if r == "m" else block_n, block_k]) for t, r in views]
