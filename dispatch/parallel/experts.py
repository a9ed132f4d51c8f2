"""Expert compute functions for the expert-parallel layer, pluggable, one default per device.

An expert function computes the M rows a rank received, grouped by local expert slot:

    fn(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI) -> out_MH
        rows counts_L[0] of slot 0 first, then slot 1, ...; out = weight · down(silu(gate)·up),
        in x's dtype (the weight is applied in fp32, like the grouped GEMM's epilogue).

Bit-identical expert parallelism needs each row's output to be the same whichever other rows
share its GEMM. Two ways to get that:
  * ``experts_loop``: one cuBLAS/MKL GEMM per expert. A GEMM's bits may depend on M (fp32 on
    CPU does), but expert e sees exactly the single-device rows when each expert lives on one rank.
  * ``experts_rowwise``: every row computed independently of M (fixed-tile Triton matmul on CUDA,
    an elementwise product + sum on CPU), so replicated experts stay bit-identical too.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from dispatch import runtime

ExpertFn = Callable[..., torch.Tensor]

if runtime.HAS_CUDA:
    import triton
    import triton.language as tl

    @triton.jit
    def _linear_rows_kernel(x_ptr, w_ptr, out_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr):
        # out[M, N] (fp32) = x[M, K] @ w[N, K]^T with fixed tiles: a row's bits never depend on M.
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rk = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rm[:, None].to(tl.int64) * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            b = tl.load(w_ptr + rn[None, :].to(tl.int64) * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(out_ptr + rm[:, None].to(tl.int64) * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def linear_rows(x_MK: torch.Tensor, w_NK: torch.Tensor) -> torch.Tensor:
    """x_MK @ w_NK.T in fp32 where each output row depends only on its input row (never on M)."""
    if x_MK.dim() != 2 or w_NK.dim() != 2 or x_MK.shape[1] != w_NK.shape[1]:
        raise ValueError(f"linear_rows needs x [M, K] and w [N, K], got {tuple(x_MK.shape)}, {tuple(w_NK.shape)}")
    M, K = x_MK.shape
    N = w_NK.shape[0]
    if x_MK.is_cuda:
        out = torch.empty(M, N, dtype=torch.float32, device=x_MK.device)
        if M:
            grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
            _linear_rows_kernel[grid](x_MK.contiguous(), w_NK.to(x_MK.dtype).contiguous(), out, M, N, K,
                                      BLOCK_M=64, BLOCK_N=64, BLOCK_K=64)
        return out
    w = w_NK.float()
    # Elementwise product, then a reduction over the contiguous last dim: the same order per row.
    chunks = [(x_MK[i:i + 32].float()[:, None, :] * w[None]).sum(-1) for i in range(0, M, 32)]
    return torch.cat(chunks) if chunks else x_MK.new_zeros(0, N, dtype=torch.float32)


def swiglu_rows(x_MH: torch.Tensor, gate_up_2IH: torch.Tensor, down_HI: torch.Tensor) -> torch.Tensor:
    """One SwiGLU expert, row-independent; fp32 result [M, H]."""
    gate_MI, up_MI = linear_rows(x_MH, gate_up_2IH).chunk(2, dim=-1)
    return linear_rows((F.silu(gate_MI) * up_MI).to(x_MH.dtype), down_HI)


def _per_expert(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI, expert) -> torch.Tensor:
    if len(counts_L) != gate_up_L2IH.shape[0] or sum(counts_L) != x_MH.shape[0]:
        raise ValueError(f"counts_L {tuple(counts_L)} must have one entry per local expert "
                         f"({gate_up_L2IH.shape[0]}) and sum to M={x_MH.shape[0]}")
    out_MH = torch.empty_like(x_MH)
    start = 0
    for slot, m in enumerate(counts_L):
        if m:
            seg = slice(start, start + m)
            out = expert(x_MH[seg], gate_up_L2IH[slot], down_LHI[slot]).float()
            out_MH[seg] = (out * weight_M[seg, None].float()).to(x_MH.dtype)
            start += m
    return out_MH


def _swiglu_gemm(x_MH, gate_up_2IH, down_HI):
    gate_MI, up_MI = F.linear(x_MH, gate_up_2IH).chunk(2, dim=-1)
    return F.linear(F.silu(gate_MI) * up_MI, down_HI)


def experts_loop(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI) -> torch.Tensor:
    """One library GEMM per expert (fast; bit-identical across ranks when experts are not replicated)."""
    return _per_expert(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI, _swiglu_gemm)


def experts_rowwise(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI) -> torch.Tensor:
    """Every row independent of M (bit-identical with replicated experts as well)."""
    return _per_expert(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI, swiglu_rows)


def experts_grouped(x_MH, weight_M, counts_L, gate_up_L2IH, down_LHI, config=None) -> torch.Tensor:
    """The kernels chapter's grouped GEMM (``dispatch.kernels.grouped_gemm.moe_experts``) on the
    received rows, each row a "token" with K = 1 routed to its local slot. The tile config is
    pinned (interpreter: its config; CUDA: ``GemmConfig()``), so a row's bits never depend on M."""
    from dispatch.kernels import gemm_config as gc
    from dispatch.kernels.grouped_gemm import moe_experts

    config = config or (gc.INTERPRET_CONFIG if runtime.INTERPRET else gc.GemmConfig())
    if len(counts_L) != gate_up_L2IH.shape[0] or sum(counts_L) != x_MH.shape[0]:
        raise ValueError(f"counts_L {tuple(counts_L)} must have one entry per local expert and sum to M")
    slot_M = torch.repeat_interleave(torch.arange(len(counts_L), device=x_MH.device),
                                     torch.tensor(counts_L, device=x_MH.device))
    return moe_experts(x_MH, weight_M[:, None].float(), slot_M[:, None], gate_up_L2IH, down_LHI, config=config)


def default_expert_fn(device: torch.device | str) -> ExpertFn:
    """CPU: ``experts_rowwise``; CUDA: ``experts_loop`` (cuBLAS; use rowwise with replicas)."""
    return experts_loop if torch.device(device).type == "cuda" else experts_rowwise
