"""Fewer launches for one token's MoE layer (batch-1 decode): 5 launches per layer become 3.

The decode path of a layer is the router GEMV, the routing kernel, then the experts' three
kernels (up+SwiGLU, down × weight, combine). Inside a CUDA graph each launch still costs a fixed
slice of GPU time (ramp-up and tail of a small grid), paid 16 × per step at OLMoE's depth. Two
fusions, for softmax routing (the "fused_router" fast path of :mod:`dispatch.families`):

    router_topk(x_TH, router_EH, cfg)   logits = x @ router.T (fp32 sums, rounded to x's dtype as
                                        a GEMM's output is), softmax, the router's top-K
                                        (``helpers.topk``: ties to the lowest id), optional
                                        renormalisation — one program per token, one launch, not two
    moe_decode_1(x_1H, w_1K, ids_1K, …) at T = 1: the up+SwiGLU kernel of ``dispatch.kernels.gemv``,
                                        then one kernel whose program owns an H tile and sums the
                                        K experts' down-projection rows × weight in fixed k order
                                        (fp32, cast once): down and combine in one launch

Both are deterministic (no atomics). Twins: :func:`router_topk_torch` (the reference router on
``F.linear`` logits) and :func:`dispatch.kernels.gemv.moe_decode_torch`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dispatch import (
    activations,
    families,
    runtime,  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
)
from dispatch.config import MoEConfig
from dispatch.kernels import pdl, tiles
from dispatch.kernels.gemv_kernels import _up_swiglu_kernel
from dispatch.kernels.helpers import topk
from dispatch.kernels.pdl import pdl_enter, pdl_exit


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, wts_ptr, ids_ptr, E, H, s_xt, s_we, scaling,
                        K: tl.constexpr, RENORM: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < E
    logits = _logits(x_ptr + t * s_xt, w_ptr, offs_e, mask_e, H, s_we, BLOCK_E, BLOCK_H)
    _rank(logits, mask_e, offs_e, wts_ptr + t * K, ids_ptr + t * K, scaling, K, RENORM, BLOCK_E, BLOCK_K)


@triton.jit
def _logits(x_row, w_ptr, offs_e, mask_e, H, s_we, BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr):
    """One token's logits of experts ``offs_e`` [BLOCK_E]: fp32 sums over H in BLOCK_H chunks, rounded to
    x's dtype as a GEMM's output is (then fp32)."""
    acc = tl.zeros([BLOCK_E], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        mask_h = offs_h < H
        x = tl.load(x_row + offs_h, mask=mask_h, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs_e[:, None] * s_we + offs_h[None, :], mask=mask_e[:, None] & mask_h[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    return acc.to(x_row.dtype.element_ty).to(tl.float32)


@triton.jit
def _rank(logits, mask_e, offs_e, wts_ptr, ids_ptr, scaling, K: tl.constexpr, RENORM: tl.constexpr,
          BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """One token's softmax over its E logits [BLOCK_E] (fp32), top-K stored at wts_ptr / ids_ptr."""
    logits = tl.where(mask_e, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, 0))
    p = p / tl.sum(p, 0)
    choice = tl.where(p != p, float("inf"), p)  # NaN (a non-finite token) ranks first: K valid ids, NaN weights
    w_1K, id_1K = topk(choice[None, :], p[None, :], mask_e[None, :], offs_e, K, 1, BLOCK_E, BLOCK_K)  # ties: lowest id
    offs_k = tl.arange(0, BLOCK_K)
    w_K, id_K = tl.sum(w_1K, axis=0), tl.sum(id_1K, axis=0)  # the one row, [BLOCK_K]
    if RENORM:
        w_K = w_K / tl.sum(tl.where(offs_k < K, w_K, 0.0), 0)
    tl.store(wts_ptr + offs_k, w_K * scaling, mask=offs_k < K)
    tl.store(ids_ptr + offs_k, id_K, mask=offs_k < K)


@triton.jit
def _router_logits_kernel(x_ptr, w_ptr, logits_ptr, E, H, s_xt, s_we,
                          BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, PDL: tl.constexpr):
    """Program (t, j): token t's logits of experts j·BLOCK_E.. into logits_ptr [T, E] (fp32)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs_e = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    mask_e = offs_e < E
    tl.store(logits_ptr + t * E + offs_e, _logits(x_ptr + t * s_xt, w_ptr, offs_e, mask_e, H, s_we, BLOCK_E, BLOCK_H),
             mask=mask_e)


@triton.jit
def _rank_kernel(logits_ptr, wts_ptr, ids_ptr, E, scaling, K: tl.constexpr, RENORM: tl.constexpr,
                 BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    """Program t: token t's softmax top-K from its E logits."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    mask_e = offs_e < E
    logits = tl.load(logits_ptr + t * E + offs_e, mask=mask_e, other=0.0)
    _rank(logits, mask_e, offs_e, wts_ptr + t * K, ids_ptr + t * K, scaling, K, RENORM, BLOCK_E, BLOCK_K)


def router_topk(x_TH: torch.Tensor, router_EH: torch.Tensor, cfg: MoEConfig, *,
                split: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Router GEMV + softmax top-K in one launch → (weights_TK fp32, ids_TK int32). ``split``: in two
    launches, the logits over programs (token, E tile) and then one program per token ranking them, each
    row's sums in the same order whatever T: one program per token streams the whole router (256 KB on
    OLMoE) from one SM, tens of µs at one token; split, E / 4 programs share it."""
    if "fused_router" not in families.get(cfg.scoring).fast_paths:
        raise ValueError(f"router_topk computes softmax routing (the families with the 'fused_router' fast path); "
                         f"{cfg.family} scores with {cfg.scoring!r}")
    if x_TH.dim() != 2 or x_TH.stride(1) != 1 or router_EH.shape != (cfg.num_experts, x_TH.shape[1]) \
            or router_EH.stride(1) != 1 or router_EH.dtype != x_TH.dtype:
        raise ValueError(f"x must be [T, H] and router [E={cfg.num_experts}, H] in x's dtype, last dims contiguous; "
                         f"got {tuple(x_TH.shape)} {x_TH.dtype} and {tuple(router_EH.shape)} {router_EH.dtype}")
    T, H = x_TH.shape
    K = cfg.top_k
    weights_TK = torch.empty(T, K, dtype=torch.float32, device=x_TH.device)
    ids_TK = torch.empty(T, K, dtype=torch.int32, device=x_TH.device)
    if T and split:
        E = cfg.num_experts
        logits_TE = torch.empty(T, E, dtype=torch.float32, device=x_TH.device)
        BLOCK_E = 4
        _router_logits_kernel[(T, triton.cdiv(E, BLOCK_E))](
            x_TH, router_EH, logits_TE, E, H, x_TH.stride(0), router_EH.stride(0), BLOCK_E=BLOCK_E,
            BLOCK_H=min(triton.next_power_of_2(H), 2048), num_warps=4, **pdl.launch_kw(x_TH.device))
        _rank_kernel[(T,)](logits_TE, weights_TK, ids_TK, E, float(cfg.routed_scaling_factor), K=K,
                           RENORM=cfg.norm_topk_prob, BLOCK_E=triton.next_power_of_2(E),
                           BLOCK_K=triton.next_power_of_2(K), num_warps=4, **pdl.launch_kw(x_TH.device))
    elif T:
        BLOCK_E = triton.next_power_of_2(cfg.num_experts)
        BLOCK_H = max(16, min(triton.next_power_of_2(H), 8192 // BLOCK_E))
        _router_topk_kernel[(T,)](x_TH, router_EH, weights_TK, ids_TK, cfg.num_experts, H, x_TH.stride(0),
                                  router_EH.stride(0), float(cfg.routed_scaling_factor), K=K,
                                  RENORM=cfg.norm_topk_prob, BLOCK_E=BLOCK_E, BLOCK_H=BLOCK_H,
                                  BLOCK_K=triton.next_power_of_2(K), num_warps=4, **pdl.launch_kw(x_TH.device))
    return weights_TK, ids_TK


def router_topk_torch(x_TH, router_EH, cfg: MoEConfig):
    """The twin of :func:`router_topk`: ``F.linear`` logits, then the reference router."""
    from dispatch.reference import route_reference

    weights_TK, ids_TK = route_reference(F.linear(x_TH, router_EH), cfg)
    return weights_TK.float(), ids_TK.to(torch.int32)


@triton.jit
def _down_combine_kernel(h_ptr, ids_ptr, w_ptr, dn_ptr, y_ptr, E, H, I, s_de, s_dh, s_hn,
                         K: tl.constexpr, BLOCK_HO: tl.constexpr, BLOCK_I: tl.constexpr, PDL: tl.constexpr):
    """y[tile] = Σ_k w_k · (h_k @ down_{e_k}[tile].T), k in order, fp32; ids outside [0, E) add nothing."""
    pdl_enter(PDL)
    offs_o = tl.program_id(0) * BLOCK_HO + tl.arange(0, BLOCK_HO)
    mask_o = offs_o < H
    y = tl.zeros([BLOCK_HO], dtype=tl.float32)
    for k in range(K):
        e = tl.load(ids_ptr + k).to(tl.int64)
        ok = (e >= 0) & (e < E)
        e = tl.where(ok, e, 0)
        i_end = tl.where(ok, I, 0)  # a bad id reads nothing
        acc = tl.zeros([BLOCK_HO], dtype=tl.float32)
        for i0 in range(0, I, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_i = offs_i < i_end
            h = tl.load(h_ptr + k * s_hn + offs_i, mask=mask_i, other=0.0).to(tl.float32)
            d = tl.load(dn_ptr + e * s_de + offs_o[:, None] * s_dh + offs_i[None, :],
                        mask=mask_o[:, None] & mask_i[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(d * h[None, :], axis=1)
        y += acc * tl.where(ok, tl.load(w_ptr + k).to(tl.float32), 0.0)
    tl.store(y_ptr + offs_o, y.to(y_ptr.dtype.element_ty), mask=mask_o)
    pdl_exit(PDL)


def moe_decode_1(x_1H, weights_1K, ids_1K, gate_up_E2IH, down_EHI, *, activation: str = "silu") -> torch.Tensor:
    """One token's routed experts in two launches: up + the gated activation, then down × weight summed over k."""
    from dispatch.checks import check_experts_inputs

    T, K, E, H, I = check_experts_inputs(x_1H, weights_1K, ids_1K, gate_up_E2IH, down_EHI)
    if T != 1 or x_1H.stride(1) != 1 or gate_up_E2IH.stride(2) != 1 or down_EHI.stride(2) != 1 \
            or not ids_1K.is_contiguous() or not weights_1K.is_contiguous():
        raise ValueError("moe_decode_1 takes one token (T = 1) with contiguous ids/weights and weights whose "
                         f"last dim is contiguous; got T={T}")
    cfg = tiles.resolve("decode", (1, K, E, H, I), x_1H.dtype, x_1H.device).config
    slots = min(E, K)
    BLOCK_E = max(16, triton.next_power_of_2(E))
    CHUNK_N = max(16, triton.next_power_of_2(K))
    h_KI = torch.empty(K, I, dtype=x_1H.dtype, device=x_1H.device)
    gate_up = (gate_up_E2IH, *gate_up_E2IH.stride()[:2], gate_up_E2IH, 0, 0, 0, gate_up_E2IH, 0)  # no scales, shared
    _up_swiglu_kernel[(cfg.grid(slots, triton.cdiv(I, cfg.block_i)),)](
        (x_1H, x_1H.stride(0)), (ids_1K, *ids_1K.stride()), gate_up, (x_1H, 0), (h_KI, h_KI.stride(0)),
        (K, K, E, H, I), trace_ptr=x_1H, NS=0,  # no shared expert, activation scales or trace
        SBR=1, SBC=1, QUANT=False, W8A8=False, LATE_SCALE=False,  # unquantized weights; no scales
        BLOCK_M=16, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_E=BLOCK_E, CHUNK_N=CHUNK_N,
        NUM_STAGES=cfg.num_stages, ACT=activations.get(activation).code, num_warps=cfg.num_warps,
        **pdl.launch_kw(x_1H.device, late=True))
    y_1H = torch.empty_like(x_1H)
    # one program per 8 rows of H (OLMoE: 256 programs, ~2 per SM), each streaming its rows of all K experts
    block_ho, block_i = (8, min(256, triton.next_power_of_2(I))) if x_1H.is_cuda else (16, cfg.block_id)
    _down_combine_kernel[(triton.cdiv(H, block_ho),)](
        h_KI, ids_1K, weights_1K, down_EHI, y_1H, E, H, I, down_EHI.stride(0), down_EHI.stride(1), h_KI.stride(0),
        K=K, BLOCK_HO=block_ho, BLOCK_I=block_i, num_warps=4, **pdl.launch_kw(x_1H.device, late=True))
    return y_1H
