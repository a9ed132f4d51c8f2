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
def _up_persistent_kernel(x, w, h,  # operands: (pointer, strides), as grouped_kernels takes them
                          rows_ptr, bexp_ptr, nblocks_ptr,  # the sort: rows, experts, used blocks
                          N, H, I, NUM_PROGS,  # sizes
                          TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, ACT: tl.constexpr):
    nb = tl.load(nblocks_ptr)
    total = nb * tl.cdiv(I, BLOCK_N)
    w_ptr = w[0]  # stands in for the scale pointers and the descriptor, never read
    for tile in range(tl.program_id(0), total, NUM_PROGS):
        pid_b = tile % nb
        e = tl.load(bexp_ptr + pid_b).to(tl.int64)
        gg._up_tile(pid_b, tile // nb, e, x, w, h, (w_ptr, 0, 0, 0), (w_ptr, 0), rows_ptr, N, H, I, w_ptr,
                    TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, 1, 1, False, False, False, False, False, ACT)


@triton.jit
def _down_persistent_kernel(h, w, out,  # operands: (pointer, strides), as grouped_kernels takes them
                            rows_ptr, bexp_ptr, wts_ptr, nblocks_ptr,  # the sort, the routing weights
                            N, H, I, NUM_PROGS,  # sizes
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                            EVEN_K: tl.constexpr):
    nb = tl.load(nblocks_ptr)
    total = nb * tl.cdiv(H, BLOCK_N)
    w_ptr = w[0]  # stands in for the scale pointers and the descriptors, never read
    for tile in range(tl.program_id(0), total, NUM_PROGS):
        pid_b = tile % nb
        e = tl.load(bexp_ptr + pid_b).to(tl.int64)
        gg._down_tile(pid_b, tile // nb, e, h, w, out, (w_ptr, 0, 0, 0), (w_ptr, 0), rows_ptr, wts_ptr,
                      N, H, I, h[0], w_ptr, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, 1, 1, False, False, False, False, False)


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
        gg._operand(x_TH), gg._operand(gate_up_E2IH), gg._operand(h_PI), routes.sorted_rows_P, routes.block_expert_B,
        routes.num_blocks_1, N, H, I, G, TOP_K=K, BLOCK_M=cu.block_m,
        BLOCK_N=cu.block_n, BLOCK_K=cu.block_k, EVEN_K=H % cu.block_k == 0, ACT=activations.get(activation).code,
        num_warps=cu.num_warps, num_stages=cu.num_stages)
    wts_N = weights_TK.reshape(-1).float().contiguous()
    out_NH = torch.empty(N, H, device=x_TH.device, dtype=x_TH.dtype)
    _down_persistent_kernel[(G,)](
        gg._operand(h_PI), gg._operand(down_EHI), gg._operand(out_NH), routes.sorted_rows_P, routes.block_expert_B,
        wts_N, routes.num_blocks_1, N, H, I, G, BLOCK_M=cd.block_m, BLOCK_N=cd.block_n,
        BLOCK_K=cd.block_k, EVEN_K=I % cd.block_k == 0, num_warps=cd.num_warps, num_stages=cd.num_stages)
    return combine(out_NH, K, ids_TK=ids_TK, num_experts=E)
