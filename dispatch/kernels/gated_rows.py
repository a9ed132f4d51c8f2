"""act(a) · b row by row, one program per row and column tile: the elementwise products of
batch-invariant mode (:mod:`dispatch.engine.invariant`), whose bits never depend on T.

    gated_rows(a_TN, b_TN, activation=)     act(a) · b: a dense MLP's or a shared expert's gated
                                            activation (SwiGLU: "silu"; :mod:`dispatch.activations`)
    gated_rows(a_T1, b_TN, gate=True)       sigmoid(a[t, 0]) · b: a shared expert's output gate

Why a kernel for an elementwise op: on a CPU, torch's vectorised SiLU and sigmoid compute an element
in the vector body or in the scalar tail depending on where it sits in the tensor, and the two round
differently. Here every element is computed the same way (fp32, :func:`dispatch.kernels.helpers.gated`,
one rounding to b's dtype) with the same tile shape for every row. Plain-PyTorch twin:
:func:`gated_rows_torch`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import activations
from dispatch.kernels.helpers import gated


@triton.jit
def _gated_rows_kernel(a_ptr, b_ptr, out_ptr, N,
                       stride_at, stride_bt, stride_ot,  # row strides (columns are contiguous)
                       ACT: tl.constexpr, GATE: tl.constexpr, BLOCK: tl.constexpr):
    """Row t, columns of tile pid(1): act(a) · b (GATE 0, a and b [T, N]) or sigmoid(a[t, 0]) · b
    (GATE 1, a [T, 1]), in fp32, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    b = tl.load(b_ptr + t * stride_bt + offs, mask=m, other=0.0).to(tl.float32)
    if GATE:
        y = tl.sigmoid(tl.load(a_ptr + t * stride_at).to(tl.float32)) * b
    else:
        a = tl.load(a_ptr + t * stride_at + offs, mask=m, other=0.0).to(tl.float32)
        y = gated(a, b, ACT)
    tl.store(out_ptr + t * stride_ot + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def _check(a_TN, b_TN, gate: bool, activation: str, what: str) -> tuple[int, int, int]:
    """(T, N, the activation's code) of valid inputs; a ValueError naming what was expected otherwise."""
    code = activations.get(activation).code
    T, N = b_TN.shape
    want = (T, 1) if gate else (T, N)
    if tuple(a_TN.shape) != want or a_TN.dtype != b_TN.dtype or a_TN.device != b_TN.device \
            or (N > 1 and b_TN.stride(1) != 1) or (not gate and N > 1 and a_TN.stride(1) != 1):
        raise ValueError(f"{what} needs a {list(want)} and b [T, N] of one dtype and device, last dims "
                         f"contiguous; got {tuple(a_TN.shape)} {a_TN.dtype}, {tuple(b_TN.shape)} {b_TN.dtype}")
    return T, N, code


def gated_rows(a_TN: torch.Tensor, b_TN: torch.Tensor, *, activation: str = "silu", gate: bool = False,
               what: str = "gated_rows") -> torch.Tensor:
    """act(a) · b row by row (``gate``: sigmoid(a [T, 1]) · b, a gated shared expert's output),
    fp32 inside, one rounding to b's dtype; each element's bits independent of T. ``what``: the name
    a ValueError reports (the caller's)."""
    T, N, code = _check(a_TN, b_TN, gate, activation, what)
    out = torch.empty_like(b_TN, memory_format=torch.contiguous_format)
    if T and N:
        block = min(1024, triton.next_power_of_2(N))
        _gated_rows_kernel[(T, triton.cdiv(N, block))](a_TN, b_TN, out, N, a_TN.stride(0), b_TN.stride(0),
                                                       out.stride(0), ACT=code, GATE=gate, BLOCK=block,
                                                       num_warps=4)
    return out


def gated_rows_torch(a_TN: torch.Tensor, b_TN: torch.Tensor, *, activation: str = "silu", gate: bool = False,
                     what: str = "gated_rows_torch") -> torch.Tensor:
    """The twin of :func:`gated_rows` (fp32, one rounding)."""
    _check(a_TN, b_TN, gate, activation, what)
    a, b = a_TN.float(), b_TN.float()
    return (torch.sigmoid(a) * b if gate else activations.gated(a, b, activation)).to(b_TN.dtype)
