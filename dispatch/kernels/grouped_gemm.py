"""Grouped GEMM: every expert's rows in one launch (up-projection + SwiGLU, weighted down-projection).

The sorted routes (``sort_by_expert``) lay the N = T·K routed rows out expert by expert, each
expert's run padded to a multiple of BLOCK_M, so every block of BLOCK_M slots belongs to one
expert (``block_expert_B``). One program = one (block b, column tile):

    up:    h_PI[slots of b, n-tile]  = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T)   t = row // K
    down:  out_NH[rows of b, n-tile] = weight[row] · (h_PI[slots of b] @ down[e].T)

The 2I-wide gate/up product stays in registers (two fp32 accumulators, SwiGLU in the epilogue).
Each routed row n is written exactly once by ``grouped_down``; ``combine`` then sums a token's K
rows in k order (fp32, one cast): no atomics anywhere, so results are bitwise reproducible.
"""
from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl
from torch.library import custom_op

from dispatch import runtime
from dispatch.kernels import gemm_config as gc
from dispatch.kernels.checks import check_experts_inputs, check_launch, no_backward, via_op
from dispatch.kernels.combine import combine_impl
from dispatch.kernels.gemm_config import GemmConfig
from dispatch.kernels.sort import sort_by_expert
from dispatch.reference import swiglu


@triton.jit
def _up_tile(pid_b, pid_n, e, x_ptr, w_ptr, h_ptr, rows_ptr, N, H, I, s_xt, s_xh, s_we, s_wn, s_wk, s_hp, s_hi,
             TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr):
    """One output tile of the up kernel: block pid_b (expert e) × columns pid_n of h."""
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m)
    valid_m = rows < N  # padding slots hold N
    t = (rows // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + t[:, None] * s_xt + offs_k[None, :] * s_xh                      # [BM, BK]
    g_ptrs = w_ptr + e * s_we + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk      # [BK, BN]
    u_ptrs = g_ptrs + I * s_wn
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(H, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid_m[:, None], other=0.0)
            bg = tl.load(g_ptrs, mask=mask_n[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = offs_k < H - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=valid_m[:, None] & mask_k[None, :], other=0.0)
            bg = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc_g = tl.dot(a, bg, acc_g)
        acc_u = tl.dot(a, bu, acc_u)
        a_ptrs += BLOCK_K * s_xh
        g_ptrs += BLOCK_K * s_wk
        u_ptrs += BLOCK_K * s_wk
    h = acc_g * tl.sigmoid(acc_g) * acc_u  # SwiGLU in fp32, in registers
    h_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * s_hp + offs_n[None, :] * s_hi
    tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=mask_n[None, :])


@triton.jit
def _up_swiglu_kernel(x_ptr, w_ptr, h_ptr, rows_ptr, bexp_ptr, N, H, I, N_BUCKET,
                      s_xt, s_xh, s_we, s_wn, s_wk, s_hp, s_hi,
                      TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid_b = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:  # blocks past the used ones do nothing
        _up_tile(pid_b, tl.program_id(1), e, x_ptr, w_ptr, h_ptr, rows_ptr, N, H, I, s_xt, s_xh, s_we, s_wn, s_wk,
                 s_hp, s_hi, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)


@triton.jit
def _down_tile(pid_b, pid_n, e, h_ptr, w_ptr, out_ptr, rows_ptr, wts_ptr, N, H, I, s_hp, s_hi, s_we, s_wn, s_wk,
               s_on, s_oh, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               EVEN_K: tl.constexpr):
    """One output tile of the down kernel: block pid_b (expert e) × columns pid_n of out."""
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m)
    valid_m = rows < N
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * s_hp + offs_k[None, :] * s_hi    # [BM, BK], slot order
    b_ptrs = w_ptr + e * s_we + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk      # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(I, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = offs_k < I - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * s_hi
        b_ptrs += BLOCK_K * s_wk
    wt = tl.load(wts_ptr + rows, mask=valid_m, other=0.0)  # routing weight of each row, fp32
    acc = acc * wt[:, None]
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * s_on + offs_n[None, :] * s_oh  # row n: written once
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid_m[:, None] & mask_n[None, :])


@triton.jit
def _down_kernel(h_ptr, w_ptr, out_ptr, rows_ptr, bexp_ptr, wts_ptr, N, H, I, N_BUCKET,
                 s_hp, s_hi, s_we, s_wn, s_wk, s_on, s_oh,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    pid_b = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:
        _down_tile(pid_b, tl.program_id(1), e, h_ptr, w_ptr, out_ptr, rows_ptr, wts_ptr, N, H, I, s_hp, s_hi,
                   s_we, s_wn, s_wk, s_on, s_oh, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)


def _even_k(kdim_name):
    return {"EVEN_K": lambda a: a[kdim_name] % a["BLOCK_K"] == 0}


_up_pinned = triton.heuristics(_even_k("H"))(_up_swiglu_kernel)
_down_pinned = triton.heuristics(_even_k("I"))(_down_kernel)
_up_tuned = triton.autotune(gc.autotune_configs("up"), key=["N_BUCKET", "H", "I", "BLOCK_M"],
                            prune_configs_by={"early_config_prune": gc.make_pruner(2)})(_up_pinned)
_down_tuned = triton.autotune(gc.autotune_configs("down"), key=["N_BUCKET", "H", "I", "BLOCK_M"],
                              prune_configs_by={"early_config_prune": gc.make_pruner(1)})(_down_pinned)


def _launch(pinned, tuned, grid_fn, args, block_m, config: GemmConfig | None, **const):
    """Run with a pinned config (interpreter: always) or let the autotuner pick BLOCK_N/K/warps/stages."""
    if config is None and runtime.INTERPRET:
        config = gc.INTERPRET_CONFIG
    if config is not None:
        meta = {"BLOCK_N": config.block_n, "BLOCK_K": config.block_k}
        pinned[grid_fn(meta)](*args, BLOCK_M=block_m, **meta, **const,
                              num_warps=config.num_warps, num_stages=config.num_stages)
    else:
        tuned[grid_fn](*args, BLOCK_M=block_m, **const)


def _check_routes(routes, n_rows: int, block_m: int | None = None):
    if routes.sorted_rows_P.dtype != torch.int32 or routes.block_expert_B.dtype != torch.int32:
        raise ValueError("routes.sorted_rows_P and routes.block_expert_B must be int32 (from sort_by_expert)")
    P, B = routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    if B == 0 or P % B:
        raise ValueError(f"routes: P={P} slots must be B={B} blocks of block_m rows")
    if block_m is not None and P // B != block_m:
        raise ValueError(f"routes were sorted with block_m={P // B}, but the config asks for {block_m}")
    if routes.slot_of_N.numel() != n_rows:
        raise ValueError(f"routes describe {routes.slot_of_N.numel()} routed rows, expected N={n_rows}")
    return P // B


def grouped_up_swiglu(x_TH: torch.Tensor, routes, gate_up_E2IH: torch.Tensor, *,
                      config: GemmConfig | None = None) -> torch.Tensor:
    """Up-projection of every sorted slot with SwiGLU fused: → h_PI (x's dtype; padding slots → 0).

    x_TH [T, H] (any strides), routes from ``sort_by_expert(ids_TK, E, block_m)``,
    gate_up_E2IH [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up). Slots of unused blocks are left unwritten.
    """
    if x_TH.dim() != 2 or gate_up_E2IH.dim() != 3:
        raise ValueError(f"x must be [T, H] and gate_up [E, 2I, H], got {tuple(x_TH.shape)} and "
                         f"{tuple(gate_up_E2IH.shape)}")
    T, H = x_TH.shape
    E, I2, H2 = gate_up_E2IH.shape
    if H2 != H or I2 % 2:
        raise ValueError(f"gate_up must be [E, 2I, H={H}], got {tuple(gate_up_E2IH.shape)}")
    if gate_up_E2IH.dtype != x_TH.dtype:
        raise ValueError(f"x is {x_TH.dtype} but gate_up is {gate_up_E2IH.dtype}")
    check_launch("grouped_up_swiglu", x_TH)
    if routes.num_tokens != T or routes.num_experts != E:
        raise ValueError(f"routes were sorted for T={routes.num_tokens} tokens and E={routes.num_experts} experts, "
                         f"but x has T={T} and gate_up E={E}")
    I, N = I2 // 2, routes.slot_of_N.numel()
    if T == 0 or N % T:
        raise ValueError(f"routes describe N={N} routed rows, not a multiple of T={T} tokens (need T > 0)")
    top_k = N // T
    bm = _check_routes(routes, N, config.block_m if config else None)
    P, B = routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    h_PI = torch.empty(P, I, device=x_TH.device, dtype=x_TH.dtype)
    args = (x_TH, gate_up_E2IH, h_PI, routes.sorted_rows_P, routes.block_expert_B, N, H, I, gc.next_pow2(N),
            *x_TH.stride(), *gate_up_E2IH.stride(), *h_PI.stride())
    _launch(_up_pinned, _up_tuned, lambda m: (B, triton.cdiv(I, m["BLOCK_N"])), args, bm, config, TOP_K=top_k)
    return h_PI


def grouped_down(h_PI: torch.Tensor, routes, down_EHI: torch.Tensor, weights_TK: torch.Tensor, *,
                 config: GemmConfig | None = None) -> torch.Tensor:
    """Down-projection times the routing weight, stored at routed row n = t·K + k: → out_NH.

    h_PI [P, I] from :func:`grouped_up_swiglu`, down_EHI [E, H, I], weights_TK [T, K] (any float;
    applied in fp32 to the fp32 accumulator, one cast on store).
    """
    if h_PI.dim() != 2 or down_EHI.dim() != 3:
        raise ValueError(f"h must be [P, I] and down [E, H, I], got {tuple(h_PI.shape)} and {tuple(down_EHI.shape)}")
    P, I = h_PI.shape
    E, H, I2 = down_EHI.shape
    if I2 != I:
        raise ValueError(f"down must be [E, H, I={I}], got {tuple(down_EHI.shape)}")
    if down_EHI.dtype != h_PI.dtype:
        raise ValueError(f"h is {h_PI.dtype} but down is {down_EHI.dtype}")
    check_launch("grouped_down", h_PI)
    if P != routes.sorted_rows_P.numel() or E != routes.num_experts:
        raise ValueError(f"routes have P={routes.sorted_rows_P.numel()} slots and E={routes.num_experts} experts, "
                         f"but h has {P} rows and down E={E}")
    if not weights_TK.is_floating_point():
        raise ValueError(f"weights must be floating point, got {weights_TK.dtype}")
    N = weights_TK.numel()
    bm = _check_routes(routes, N, config.block_m if config else None)
    B = routes.block_expert_B.numel()
    wts_N = weights_TK.reshape(-1).float().contiguous()
    out_NH = torch.empty(N, H, device=h_PI.device, dtype=h_PI.dtype)
    args = (h_PI, down_EHI, out_NH, routes.sorted_rows_P, routes.block_expert_B, wts_N, N, H, I, gc.next_pow2(N),
            *h_PI.stride(), *down_EHI.stride(), *out_NH.stride())
    _launch(_down_pinned, _down_tuned, lambda m: (B, triton.cdiv(H, m["BLOCK_N"])), args, bm, config)
    return out_NH


def moe_experts(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, config: GemmConfig | None = None,
                check_ids: bool = False) -> torch.Tensor:
    """The routed experts: sort → grouped up+SwiGLU → grouped down×weight → combine.  → y_TH [T, H].

    Same math as ``reference.experts_reference``; fp32 accumulation everywhere, a token's K
    contributions summed in k order. ``config`` pins all tile sizes (rows then do not depend on
    each other: bitwise the same whether computed alone or in a batch). Ids outside [0, E) add
    nothing (``check_ids=True``: raise instead, one host sync); see :mod:`dispatch.kernels.checks`.
    Registered as ``torch.ops.dispatch.moe_experts`` (``torch.compile`` keeps it whole; no backward).
    """
    check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)
    if config is not None and not isinstance(config, GemmConfig):
        raise ValueError(f"config must be a GemmConfig (tiles of the grouped GEMM), got {type(config).__name__}")
    check_launch("moe_experts", x_TH)
    tiles = list(dataclasses.astuple(config)) if config is not None else None
    op = torch.ops.dispatch.moe_experts if via_op(x_TH, weights_TK, gate_up_E2IH, down_EHI) else _moe_experts_impl
    return op(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, tiles)


def _moe_experts_impl(x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, gate_up_E2IH: torch.Tensor,
                    down_EHI: torch.Tensor, tiles: list[int] | None) -> torch.Tensor:
    (T, H), (K, E) = x_TH.shape, (ids_TK.shape[1], gate_up_E2IH.shape[0])
    if T == 0:
        return x_TH.new_zeros(0, H)
    config = GemmConfig(*tiles) if tiles is not None else None
    bm = config.block_m if config else gc.pick_block_m(T * K, E, x_TH.device)
    routes = sort_by_expert(ids_TK, E, bm)
    h_PI = grouped_up_swiglu(x_TH, routes, gate_up_E2IH, config=config)
    out_NH = grouped_down(h_PI, routes, down_EHI, weights_TK, config=config)
    return combine_impl(out_NH, K, ids_TK, E, out_NH.dtype)


_moe_experts_op = custom_op("dispatch::moe_experts", _moe_experts_impl, mutates_args=())


@_moe_experts_op.register_fake
def _(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, tiles):
    return torch.empty_like(x_TH)


no_backward(_moe_experts_op, "dispatch.kernels.grouped_gemm.moe_experts")


# ---- plain-PyTorch twins (what the kernels compute, slot by slot) ----

def grouped_up_swiglu_torch(x_TH, routes, gate_up_E2IH) -> torch.Tensor:
    """Twin of :func:`grouped_up_swiglu`: h_PI with padding slots (and unused blocks) zero.

    One expert at a time (its weights used in place, never copied per row): fp32 products,
    SwiGLU in fp32, one rounding to x's dtype, as the kernel does.
    """
    T, H = x_TH.shape
    N, P, B = routes.slot_of_N.numel(), routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    I = gate_up_E2IH.shape[1] // 2
    h_PI = x_TH.new_zeros(P, I)
    rows_P = routes.sorted_rows_P.long()
    e_P = routes.block_expert_B.long().repeat_interleave(P // B)
    valid_P = (rows_P < N) & (e_P >= 0)
    for e in torch.unique(e_P[valid_P]).tolist():
        slots = torch.nonzero(valid_P & (e_P == e)).flatten()
        h_PI[slots] = swiglu(x_TH[rows_P[slots] // (N // T)].float() @ gate_up_E2IH[e].float().T).to(x_TH.dtype)
    return h_PI


def grouped_down_torch(h_PI, routes, down_EHI, weights_TK) -> torch.Tensor:
    """Twin of :func:`grouped_down`: out_NH[n] = weight[n] · (h[slot_of_N[n]] @ down[e(n)].T).

    One expert at a time, fp32, one rounding. Rows in no block (ids outside [0, E)) stay 0.
    """
    N, P, B = routes.slot_of_N.numel(), routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    H = down_EHI.shape[1]
    out_NH = h_PI.new_zeros(N, H)
    slot_N = routes.slot_of_N.long()
    placed_N = slot_N < P
    e_N = torch.where(placed_N, routes.block_expert_B.long()[slot_N.clamp(max=P - 1) // (P // B)], -1)
    wts_N = weights_TK.reshape(-1).float()
    for e in torch.unique(e_N[placed_N]).tolist():
        rows = torch.nonzero(e_N == e).flatten()
        out_MH = h_PI[slot_N[rows]].float() @ down_EHI[e].float().T
        out_NH[rows] = (out_MH * wts_N[rows, None]).to(h_PI.dtype)
    return out_NH
