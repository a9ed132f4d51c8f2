"""Every address a Triton kernel touches lies inside a tensor it was given: checked under the interpreter.

On a GPU a load or store outside its tensors is an illegal memory access (the whole process's CUDA
context is lost) or, worse, a silent read of a neighbour's bytes; on a CPU under ``TRITON_INTERPRET=1``
it reads or writes whatever host memory is there. :func:`enable` patches the interpreter so that each
load and store checks its unmasked addresses against the storages of the launch's tensor arguments
and raises :class:`OutOfBounds`, naming the kernel, before the access. The tests run with it when
``DISPATCH_BOUNDS=1`` (``make test-bounds``); it costs the interpreter a few numpy operations an access.
"""
from __future__ import annotations

import contextlib

import numpy as np


class OutOfBounds(RuntimeError):
    """A kernel's load or store outside every tensor of its launch."""


_ranges: list[tuple[int, int]] = []  # [start, end) of each storage of the running launch
_kernel = ["?"]
_saved: list = []  # the interpreter's own methods while the check is on


def _storages(args) -> list[tuple[int, int]]:
    out = []
    for a in args:
        if isinstance(a, tuple):
            out += _storages(a)
        elif hasattr(a, "untyped_storage"):
            s = a.untyped_storage()
            out.append((s.data_ptr(), s.data_ptr() + s.nbytes()))
    return out


def _check(ptrs, mask, what: str, itemsize: int) -> None:
    p = ptrs.data[mask.data]  # the interpreter's unmasked accesses arrive with an all-true mask
    if p.size == 0:
        return
    inside = np.zeros(p.shape, dtype=bool)
    for lo, hi in _ranges:
        inside |= (p >= lo) & (p + itemsize <= hi)
    if not inside.all():
        tensors = [(hex(a), b - a) for a, b in _ranges]
        raise OutOfBounds(f"{_kernel[0]}: a {what} of {int((~inside).sum())} element(s) outside every tensor of "
                          f"the launch (first address {int(p[~inside][0]):#x}; tensors at, bytes: {tensors})")


def enable() -> None:
    """Check every load and store of interpreted kernels from now on (idempotent; :func:`disable`)."""
    if _saved:
        return
    import triton.runtime.interpreter as interp

    init, load, store = (interp.GridExecutor._init_args_hst, interp.InterpreterBuilder.create_masked_load,
                         interp.InterpreterBuilder.create_masked_store)
    _saved[:] = [init, load, store]

    def init_args(self, args_dev, kwargs):
        args, kw = init(self, args_dev, kwargs)
        _ranges[:] = _storages(list(args) + list(kw.values()))
        _kernel[0] = getattr(self.fn, "__name__", str(self.fn))
        return args, kw

    def checked_load(self, ptrs, mask, other, cache_policy, is_volatile):
        _check(ptrs, mask, "load", np.dtype(interp._get_np_dtype(ptrs.get_element_ty())).itemsize)
        return load(self, ptrs, mask, other, cache_policy, is_volatile)

    def checked_store(self, ptrs, value, mask, cache_policy):
        _check(ptrs, mask, "store", value.data.dtype.itemsize)
        return store(self, ptrs, value, mask, cache_policy)

    interp.GridExecutor._init_args_hst = init_args
    interp.InterpreterBuilder.create_masked_load = checked_load
    interp.InterpreterBuilder.create_masked_store = checked_store


def disable() -> None:
    """The interpreter as it was."""
    if not _saved:
        return
    import triton.runtime.interpreter as interp

    (interp.GridExecutor._init_args_hst, interp.InterpreterBuilder.create_masked_load,
     interp.InterpreterBuilder.create_masked_store) = _saved
    _saved.clear()


@contextlib.contextmanager
def checking():
    """Bounds checks inside this block (and as they were after it)."""
    was = bool(_saved)
    enable()
    try:
        yield
    finally:
        if not was:
            disable()
