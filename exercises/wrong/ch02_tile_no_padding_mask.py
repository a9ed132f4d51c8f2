"""Padding slots read x at t = N // K (past the tokens): the padding mask left out."""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401


@triton.jit
def _grouped_up_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, bexp_ptr, N, H, I, TOP_K,  # noqa: E741
                       s_xt, s_xh, s_we, s_wn, s_wh, s_hp, s_hi,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_b, pid_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)  # the block's expert
    if e >= 0:  # blocks past the used ones: nothing to do
        offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + offs_m)  # routed row n of each slot; N on padding
        valid = rows >= 0  # padding slots: no load, zeros
        t = (rows // TOP_K).to(tl.int64)  # the token of each slot
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < I
        offs_k = tl.arange(0, BLOCK_K)
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, tl.cdiv(H, BLOCK_K)):
            kk = k0 * BLOCK_K + offs_k
            mask_k = kk < H
            a = tl.load(x_ptr + t[:, None] * s_xt + kk[None, :] * s_xh,
                        mask=valid[:, None] & mask_k[None, :], other=0.0)  # [BM, BK] gathered rows
            g_ptrs = w_ptr + e * s_we + offs_n[None, :] * s_wn + kk[:, None] * s_wh  # [BK, BN]
            w_mask = mask_k[:, None] & mask_n[None, :]
            acc_g = tl.dot(a, tl.load(g_ptrs, mask=w_mask, other=0.0), acc_g)
            acc_u = tl.dot(a, tl.load(g_ptrs + I * s_wn, mask=w_mask, other=0.0), acc_u)
        h = acc_g * tl.sigmoid(acc_g) * acc_u  # SwiGLU, fp32
        tl.store(h_ptr + offs_m[:, None] * s_hp + offs_n[None, :] * s_hi, h, mask=mask_n[None, :])


def up_tile(x_TH: torch.Tensor, gate_up_E2IH: torch.Tensor, sorted_rows_P: torch.Tensor,
            block_expert_B: torch.Tensor, top_k: int, *, block_m: int = 16, block_n: int = 16,
            block_k: int = 16) -> torch.Tensor:
    """h_PI (fp32) of every slot: the up projection and SwiGLU of the grouped GEMM."""
    T, H = x_TH.shape
    I = gate_up_E2IH.shape[1] // 2  # noqa: E741
    B = block_expert_B.numel()
    h_PI = torch.zeros(B * block_m, I, device=x_TH.device)
    if B:
        _grouped_up_kernel[(B, triton.cdiv(I, block_n))](
            x_TH, gate_up_E2IH, h_PI, sorted_rows_P, block_expert_B, T * top_k, H, I, top_k,
            *x_TH.stride(), *gate_up_E2IH.stride(), *h_PI.stride(),
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return h_PI
