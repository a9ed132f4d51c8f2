"""The k-order combine: y_TH[t] = Σ_{k=0..K-1} out_NH[t·K + k], in k order, fp32, one cast.

Used by the grouped path, the decode path and expert parallelism. No atomics and no scatter:
token t reads its K routed rows (rows t·K .. t·K+K-1) and adds them in a fixed order from a zero
fp32 accumulator, so the result is bitwise the same run to run. The torch twin performs the very
same fp32 additions in the same order, so the two agree bit for bit.

With ``ids_TK`` and ``num_experts`` given, a row whose expert id lies outside [0, E) adds nothing:
its value is never used (it may be unwritten memory), selected away rather than multiplied by 0.
Without them every row is summed: the public ``grouped_down`` zeroes the rows it computes nowhere.
The decode path's shared experts (``combine_impl(extra=n)``) add n rows per token after its K, with
no id to check: token t's rows are t·(K+n) .. t·(K+n)+K+n-1, summed in that order.

Example: K = 2, out_NH rows [a0, a1, b0, b1] → y_TH rows [a0 + a1, b0 + b1].
The sum itself is :func:`dispatch.kernels.helpers.k_order_sum`, which the one-launch decode kernel
(:mod:`dispatch.kernels.decode_fused`) runs too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import custom_op

from dispatch.checks import check_launch, check_tensor, no_backward, via_op
from dispatch.kernels import pdl
from dispatch.kernels.helpers import k_order_sum
from dispatch.kernels.pdl import pdl_enter, pdl_exit


@triton.jit
def _combine_kernel(out_ptr, ids_ptr, y_ptr, H, E, s_on, s_oh, s_it, s_ik, s_yt, s_yh,
                    TOP_K: tl.constexpr, HAS_IDS: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr,
                    NS: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)  # [1]: this program's token
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = k_order_sum(out_ptr, ids_ptr, t, t >= 0, offs, mask, TOP_K, E, s_on, s_oh, s_it, s_ik,
                      NS, TOP_K + NS, HAS_IDS, "", 1, BLOCK_H)  # fixed k order; the NS shared rows last
    tl.store(y_ptr + t[:, None] * s_yt + offs[None, :] * s_yh, acc.to(y_ptr.dtype.element_ty), mask=mask[None, :])
    pdl_exit(PDL)


def _check_combine(out_NH, K, ids_TK, num_experts):
    check_tensor("out_NH", out_NH, dims=2)
    if not isinstance(K, int) or isinstance(K, bool) or K < 1:
        raise ValueError(f"K must be a positive int, got {K!r}")
    if out_NH.shape[0] % K:
        raise ValueError(f"out_NH must be [N, H] with N a multiple of K={K}, got {tuple(out_NH.shape)}")
    if (ids_TK is None) != (num_experts is None):
        raise ValueError("pass ids_TK and num_experts together (to drop rows with ids outside [0, E)), or neither")
    if ids_TK is not None:
        check_tensor("ids_TK", ids_TK, dims=2)
        if tuple(ids_TK.shape) != (out_NH.shape[0] // K, K) or ids_TK.device != out_NH.device:
            raise ValueError(f"ids_TK must be [T={out_NH.shape[0] // K}, K={K}] on {out_NH.device}, got "
                             f"{tuple(ids_TK.shape)} on {ids_TK.device}")


def combine(out_NH: torch.Tensor, K: int, *, ids_TK: torch.Tensor | None = None, num_experts: int | None = None,
            dtype: torch.dtype | None = None) -> torch.Tensor:
    """out_NH [N = T·K, H] (row n = t·K + k) → y_TH [T, H] in ``dtype`` (default: out's dtype).

    ``ids_TK`` [T, K] and ``num_experts`` E: rows with an id outside [0, E) add nothing.
    """
    _check_combine(out_NH, K, ids_TK, num_experts)
    check_launch("combine", out_NH)
    op = torch.ops.dispatch.combine if via_op(out_NH) else combine_impl
    return op(out_NH, K, ids_TK, num_experts or 0, dtype or out_NH.dtype)


def combine_impl(out_NH: torch.Tensor, K: int, ids_TK: torch.Tensor | None, E: int,
                 dtype: torch.dtype, extra: int = 0) -> torch.Tensor:
    """The launch behind :func:`combine` (inputs already checked; ``ids_TK`` None: no masking);
    ``extra``: rows per token after its K with no id (the decode path's shared experts)."""
    N, H = out_NH.shape
    T = N // (K + extra)
    y_TH = torch.empty(T, H, device=out_NH.device, dtype=dtype)
    if T == 0 or H == 0:
        return y_TH
    block_h = min(1024, triton.next_power_of_2(H))
    s_it, s_ik = ids_TK.stride() if ids_TK is not None else (0, 0)
    _combine_kernel[(T, triton.cdiv(H, block_h))](
        out_NH, ids_TK if ids_TK is not None else out_NH, y_TH, H, E, *out_NH.stride(), s_it, s_ik,
        *y_TH.stride(), TOP_K=K, HAS_IDS=ids_TK is not None, BLOCK_H=block_h, num_warps=4, NS=extra,
        **pdl.launch_kw(out_NH.device, late=True))
    return y_TH


_combine_op = custom_op("dispatch::combine", combine_impl, mutates_args=())


@_combine_op.register_fake
def _(out_NH, K, ids_TK, E, dtype):
    return out_NH.new_empty(out_NH.shape[0] // K, out_NH.shape[1], dtype=dtype)


no_backward(_combine_op, "dispatch.kernels.combine.combine")


def combine_torch(out_NH: torch.Tensor, K: int, *, ids_TK: torch.Tensor | None = None,
                  num_experts: int | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The twin: the same fp32 additions in the same k order (bitwise equal to the kernel)."""
    _check_combine(out_NH, K, ids_TK, num_experts)
    N, H = out_NH.shape
    out_TKH = out_NH.view(N // K, K, H)
    acc_TH = torch.zeros(N // K, H, device=out_NH.device, dtype=torch.float32)
    for k in range(K):
        row_TH = out_TKH[:, k].float()
        if ids_TK is not None:
            ok_T1 = ((ids_TK[:, k] >= 0) & (ids_TK[:, k] < num_experts))[:, None]
            row_TH = torch.where(ok_T1, row_TH, 0.0)
        acc_TH = acc_TH + row_TH
    return acc_TH.to(dtype or out_NH.dtype)
