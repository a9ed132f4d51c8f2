"""Chapter 2, exercise 2: the grouped GEMM's up tile — block → expert, row gather, padding mask.

Chapter 1's sort lays the N = T·K routed rows out expert by expert, each expert's run padded to a
multiple of BLOCK_M: ``sorted_rows_P`` holds the routed row n = t·K + k of each of the P slots (N
on a padding slot), ``block_expert_B`` the expert of each block of BLOCK_M slots (-1 for the
blocks past the used ones). Program (b, j) computes rows b·BLOCK_M … of h_PI, columns
j·BLOCK_N …, where for a slot carrying row n of token t = n // K and expert e:

    h[slot] = silu(x[t] · gate_eᵀ) ⊙ (x[t] · up_eᵀ)      gate_e = gate_up_E2IH[e, :I], up_e = [e, I:]

Complete ``_grouped_up_kernel``:

* look up the block's expert; a block of -1 does nothing (it reads and stores nothing);
* gather the block's rows of x through ``sorted_rows_P``; a padding slot must not read x at all
  (mask the load: it gets zeros, and its h is 0);
* loop over H in steps of BLOCK_K, two ``tl.dot`` into fp32 accumulators, masked at the edges of
  H and I (neither need be a multiple of the blocks);
* store SwiGLU of the two accumulators (fp32) at the block's slots.

``up_tile`` (given) allocates h_PI filled with zeros and launches the grid (B, cdiv(I, BLOCK_N)).
"""
import torch
import triton
import triton.language as tl

import dispatch  # noqa: F401  (turns on the interpreter on a machine without CUDA)


@triton.jit
def _grouped_up_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, bexp_ptr, N, H, I, TOP_K,  # noqa: E741
                       s_xt, s_xh, s_we, s_wn, s_wh, s_hp, s_hi,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pass  # your kernel here


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
