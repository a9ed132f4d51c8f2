"""Deterministic combine: y_TH[t] = Σ_{k=0..K-1} out_NH[t·K + k], in k order, fp32, one cast.

No atomics and no scatter: token t reads its K routed rows (contiguous, rows t·K .. t·K+K-1) and
adds them in a fixed order, so the result is bitwise the same run to run. The torch twin performs
the very same fp32 additions in the same order, so the two agree bit for bit.

Example: K = 2, out_NH rows [a0, a1, b0, b1] → y_TH rows [a0 + a1, b0 + b1].
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime


@triton.jit
def _combine_kernel(out_ptr, y_ptr, H, s_on, s_oh, s_yt, s_yh, TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = offs < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):  # fixed k order
        acc += tl.load(out_ptr + (t * TOP_K + k) * s_on + offs * s_oh, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + t * s_yt + offs * s_yh, acc.to(y_ptr.dtype.element_ty), mask=mask)


def combine(out_NH: torch.Tensor, K: int) -> torch.Tensor:
    """out_NH [N = T·K, H] (row n = t·K + k) → y_TH [T, H] in out's dtype."""
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be a positive int, got {K!r}")
    if out_NH.dim() != 2 or out_NH.shape[0] % K:
        raise ValueError(f"out must be [N, H] with N a multiple of K={K}, got {tuple(out_NH.shape)}")
    N, H = out_NH.shape
    T = N // K
    y_TH = torch.empty(T, H, device=out_NH.device, dtype=out_NH.dtype)
    if T == 0:
        return y_TH
    if not runtime.triton_ok(out_NH):
        return combine_torch(out_NH, K)
    block_h = min(1024, triton.next_power_of_2(H))
    _combine_kernel[(T, triton.cdiv(H, block_h))](out_NH, y_TH, H, *out_NH.stride(), *y_TH.stride(),
                                                  TOP_K=K, BLOCK_H=block_h, num_warps=4)
    return y_TH


def combine_torch(out_NH: torch.Tensor, K: int) -> torch.Tensor:
    """The twin: the same fp32 additions in the same k order (bitwise equal to the kernel)."""
    N, H = out_NH.shape
    out_TKH = out_NH.view(N // K, K, H)
    acc_TH = torch.zeros(N // K, H, device=out_NH.device, dtype=torch.float32)
    for k in range(K):
        acc_TH = acc_TH + out_TKH[:, k].float()
    return acc_TH.to(out_NH.dtype)
