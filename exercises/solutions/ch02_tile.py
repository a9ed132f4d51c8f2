"""Chapter 2, exercise 2: the up-projection tile with the SwiGLU epilogue.

One expert, M rows: ``h_MI = silu(x_MH · gate_IHᵀ) ⊙ (x_MH · up_IHᵀ)`` where ``gate_up_2IH`` stacks
gate (rows 0..I-1) over up (rows I..2I-1). The grid is (cdiv(M, BLOCK_M), cdiv(I, BLOCK_N)): a
program computes a BLOCK_M × BLOCK_N tile of h. Complete ``_up_tile_kernel``: the offsets and
masks (M, I and H need not be multiples of the blocks), a loop over H in steps of BLOCK_K with
two ``tl.dot`` into fp32 accumulators, and the epilogue that applies SwiGLU and stores h.
"""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (turns on the interpreter on a machine without CUDA)


@triton.jit
def _up_tile_kernel(x_ptr, w_ptr, h_ptr, M, H, I, s_xm, s_xh, s_wn, s_wh, s_hm, s_hi,  # noqa: E741
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m, mask_n = offs_m < M, offs_n < I
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(H, BLOCK_K)):
        kk = k0 * BLOCK_K + offs_k
        mask_k = kk < H
        a = tl.load(x_ptr + offs_m[:, None] * s_xm + kk[None, :] * s_xh,
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        g_ptrs = w_ptr + offs_n[None, :] * s_wn + kk[:, None] * s_wh
        bmask = mask_k[:, None] & mask_n[None, :]
        acc_g = tl.dot(a, tl.load(g_ptrs, mask=bmask, other=0.0), acc_g)
        acc_u = tl.dot(a, tl.load(g_ptrs + I * s_wn, mask=bmask, other=0.0), acc_u)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + offs_m[:, None] * s_hm + offs_n[None, :] * s_hi, h,
             mask=mask_m[:, None] & mask_n[None, :])


def up_swiglu(x_MH: torch.Tensor, gate_up_2IH: torch.Tensor, *, block_m=16, block_n=16, block_k=16):
    """h_MI (fp32) of one expert."""
    M, H = x_MH.shape
    I = gate_up_2IH.shape[0] // 2  # noqa: E741
    h_MI = torch.full((M, I), float("nan"), device=x_MH.device)
    grid = (triton.cdiv(M, block_m), triton.cdiv(I, block_n))
    if M:
        _up_tile_kernel[grid](x_MH, gate_up_2IH, h_MI, M, H, I, *x_MH.stride(), *gate_up_2IH.stride(),
                              *h_MI.stride(), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return h_MI
