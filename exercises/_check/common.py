"""What the checks share: seeded generators, a tolerance comparison, and guards that refuse what
a CUDA graph refuses (a host read) or what an exercise must do by hand (a dtype conversion)."""
from __future__ import annotations

import contextlib

import torch


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def close(name: str, got, ref, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert isinstance(got, torch.Tensor), f"{name}: expected a tensor, got {type(got).__name__}"
    assert tuple(got.shape) == tuple(ref.shape), f"{name}: shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    assert torch.allclose(got.double(), ref.double(), rtol=rtol, atol=atol), \
        f"{name}: values differ (max abs diff {(got.double() - ref.double()).abs().max().item():.3g})"


_HOST_READS = [(torch.Tensor, n) for n in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__",
                                            "nonzero", "multinomial")] + [(torch, "nonzero"), (torch, "multinomial")]


@contextlib.contextmanager
def no_host_sync(what: str):
    """Inside, anything that reads a tensor's value on the host (``.item()``, ``.tolist()``, a Python
    ``if`` on a tensor, ``nonzero``, ``multinomial``) raises AssertionError, as capture into a CUDA
    graph refuses it."""
    def refuse(name):
        def read(*args, **kwargs):
            raise AssertionError(f"{what} reads a value on the host ({name}): a CUDA graph cannot hold that")
        return read

    saved = [(owner, name, owner.__dict__.get(name)) for owner, name in _HOST_READS]
    for owner, name, _ in saved:
        setattr(owner, name, refuse(name))
    try:
        yield
    finally:
        for owner, name, old in saved:
            if old is None:
                delattr(owner, name)
            else:
                setattr(owner, name, old)


_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))


@contextlib.contextmanager
def no_float8(what: str):
    """Inside, converting or viewing a tensor as an fp8 dtype raises AssertionError: an exercise that
    decodes fp8 by its bits must not borrow PyTorch's conversion."""
    def guard(name, old):
        def call(self, *args, **kwargs):
            if any(a in _FP8 for a in [*args, *kwargs.values()]):
                raise AssertionError(f"{what} converts through an fp8 dtype ({name}): do it with the bits")
            return old(self, *args, **kwargs)
        return call

    saved = {n: torch.Tensor.__dict__.get(n) for n in ("to", "view", "type")}
    for n in saved:
        setattr(torch.Tensor, n, guard(n, getattr(torch.Tensor, n)))
    try:
        yield
    finally:
        for n, old in saved.items():
            if old is None:
                delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, old)
