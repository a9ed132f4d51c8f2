"""A persistent grouped GEMM: one program per SM, each walking over many output tiles.

The plain launch (``grouped_gemm``) starts one program per (block, column tile), including the
blocks the sort reserved for the worst case that turn out unused: they start, read their expert
id, and exit. Here the grid is the number of SMs; program p takes tiles p, p + G, p + 2G, ... of
the ``num_blocks × column tiles`` that are really used (``num_blocks_1`` read on the device, so
still no host sync). Blocks vary fastest, so the programs running together share an expert's
weight tile in L2. The tile code is the same (``_up_tile`` / ``_down_tile``); only the schedule
differs. It is kept as a benchmark contestant: see chapter 2 for where it wins, if anywhere.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import activations, runtime
from dispatch.checks import check_experts_inputs, check_launch
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels import tiles
from dispatch.kernels.combine import combine
from dispatch.kernels.sort import sort_by_expert


@triton.jit
def _up_persistent_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, bexp_ptr, nblocks_ptr, N, H, I,
                          s_xt, s_xh, s_we, s_wn, s_wk, s_hp, s_hi, NUM_PROGS,
                          TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, ACT: tl.constexpr):
    nb = tl.load(nblocks_ptr)
    total = nb * tl.cdiv(I, BLOCK_N)
    for tile in range(tl.program_id(0), total, NUM_PROGS):
        pid_b = tile % nb
        e = tl.load(bexp_ptr + pid_b).to(tl.int64)
        gg._up_tile(pid_b, tile // nb, e, x_ptr, w_ptr, h_ptr, rows_ptr, N, H, I, s_xt, s_xh, s_we, s_wn, s_wk,
                    s_hp, s_hi, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                    w_ptr, 0, 0, 0, 1, 1, False, False, False, False, w_ptr, 0, w_ptr, False, ACT)


@triton.jit
def _down_persistent_kernel(h_ptr, w_ptr, out_ptr, rows_ptr, bexp_ptr, wts_ptr, nblocks_ptr, N, H, I,
                            s_hp, s_hi, s_we, s_wn, s_wk, s_on, s_oh, NUM_PROGS,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            EVEN_K: tl.constexpr):
    nb = tl.load(nblocks_ptr)
    total = nb * tl.cdiv(H, BLOCK_N)
    for tile in range(tl.program_id(0), total, NUM_PROGS):
        pid_b = tile % nb
        e = tl.load(bexp_ptr + pid_b).to(tl.int64)
        gg._down_tile(pid_b, tile // nb, e, h_ptr, w_ptr, out_ptr, rows_ptr, wts_ptr, N, H, I, s_hp, s_hi,
                      s_we, s_wn, s_wk, s_on, s_oh, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
                      w_ptr, 0, 0, 0, 1, 1, False, False, False, False, w_ptr, 0, h_ptr, w_ptr, False)


def moe_experts_persistent(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, configs=None,
                           check_ids: bool = False, activation: str = "silu"):
    """Same contract as ``grouped_gemm.moe_experts`` (bad-id policy included), with persistent up and
    down kernels (a benchmark contestant: not registered as an op). Tiles: ``configs`` = (up, down),
    default :func:`dispatch.kernels.tiles.resolve` (its ``group_m`` is unused here)."""
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)
    check_launch("moe_experts_persistent", x_TH)
    if T == 0:
        return x_TH.new_zeros(0, H)
    cu, cd = tiles.resolve("grouped", (T, K, E, H, I), x_TH.dtype, x_TH.device, config=configs).config
    if cu.block_m != cd.block_m:
        raise ValueError(f"up and down configs must share block_m, got {cu.block_m} and {cd.block_m}")
    routes = sort_by_expert(ids_TK, E, cu.block_m)
    G = runtime.num_sms(x_TH.device)
    N, P = T * K, routes.sorted_rows_P.numel()
    h_PI = torch.empty(P, I, device=x_TH.device, dtype=x_TH.dtype)
    _up_persistent_kernel[(G,)](
        x_TH, gate_up_E2IH, h_PI, routes.sorted_rows_P, routes.block_expert_B, routes.num_blocks_1, N, H, I,
        *x_TH.stride(), *gate_up_E2IH.stride(), *h_PI.stride(), G, TOP_K=K, BLOCK_M=cu.block_m,
        BLOCK_N=cu.block_n, BLOCK_K=cu.block_k, EVEN_K=H % cu.block_k == 0, ACT=activations.get(activation).code,
        num_warps=cu.num_warps, num_stages=cu.num_stages)
    wts_N = weights_TK.reshape(-1).float().contiguous()
    out_NH = torch.empty(N, H, device=x_TH.device, dtype=x_TH.dtype)
    _down_persistent_kernel[(G,)](
        h_PI, down_EHI, out_NH, routes.sorted_rows_P, routes.block_expert_B, wts_N, routes.num_blocks_1, N, H, I,
        *h_PI.stride(), *down_EHI.stride(), *out_NH.stride(), G, BLOCK_M=cd.block_m, BLOCK_N=cd.block_n,
        BLOCK_K=cd.block_k, EVEN_K=I % cd.block_k == 0, num_warps=cd.num_warps, num_stages=cd.num_stages)
    return combine(out_NH, K, ids_TK=ids_TK, num_experts=E)
