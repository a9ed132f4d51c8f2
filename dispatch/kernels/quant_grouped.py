"""Grouped GEMM on quantized experts: w8a16 (int8 / fp8 codes) and fp8 w8a8 (sm_89+).

The schedule of :mod:`dispatch.kernels.grouped_gemm` (sort by expert → one program per (block of
BLOCK_M sorted rows, column tile) → combine in k order), with the weight tiles read as 8-bit codes
and dequantized in registers (:mod:`dispatch.kernels.quant_kernels`):

    w8a16  codes → x's dtype (exact), bf16/fp16 tensor cores, × the scale of each column's block
    w8a8   fp8 e4m3 codes and activations quantized on load, one scale per token and 128 columns
           (BLOCK_K = 128), fp8 tensor cores: twice the bf16 peak on an H100/H200 (sm_89+; under
           the interpreter the activations are rounded to e4m3 in fp32 first: ``_e4m3_round``)

Plain-PyTorch twin: :func:`moe_experts_quant_torch` (per expert, fp32, the same activation rounding).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.kernels import gemm_config as gc
from dispatch.kernels.checks import check_experts_inputs
from dispatch.kernels.combine import combine, combine_torch
from dispatch.kernels.gemm_config import GemmConfig
from dispatch.kernels.quant_gemv import check_chunk, scale_strides, stand_ins
from dispatch.kernels.quant_kernels import _block_scales, _qdot
from dispatch.kernels.sort import sort_by_expert
from dispatch.quant.formats import FP8, QuantizedExperts, fp8_activations


def check_experts_input(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI) -> None:
    """The one validator; ids outside [0, E) refused on CPU (one sync), as ``moe_decode_quant`` does."""
    check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=x_TH.device.type == "cpu")


W8A8_GROUP = 128  # activation columns per scale in w8a8 (= BLOCK_K)


@triton.jit
def _up_q_kernel(x_ptr, q_ptr, s_ptr, h_ptr, rows_ptr, bexp_ptr, N, H, I,
                 s_xt, s_xh, s_qe, s_qn, s_qk, s_se, s_sr, s_sc, s_hp, s_hi,
                 TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SBR: tl.constexpr, SBC: tl.constexpr, W8A8: tl.constexpr, LATE_SCALE: tl.constexpr,
                 PRE_ROUND: tl.constexpr):
    """h_PI[slots of block b, n-tile] = silu(x @ gate.T) * (x @ up.T), gate/up dequantized in registers."""
    pid_b = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:  # blocks past the used ones do nothing
        offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + offs_m)
        valid_m = rows < N  # padding slots hold N
        t = (rows // TOP_K).to(tl.int64)
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < I
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = x_ptr + t[:, None] * s_xt + offs_k[None, :] * s_xh
        g_ptrs = q_ptr + e * s_qe + offs_n[None, :] * s_qn + offs_k[:, None] * s_qk
        u_ptrs = g_ptrs + I * s_qn
        s_e = s_ptr + e * s_se
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, tl.cdiv(H, BLOCK_K)):
            mask_k = offs_k < H - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=valid_m[:, None] & mask_k[None, :], other=0.0)
            bg = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            sg = _block_scales(s_e, offs_n, k0 * BLOCK_K, mask_n, s_sr, s_sc, SBR, SBC)
            su = _block_scales(s_e, I + offs_n, k0 * BLOCK_K, mask_n, s_sr, s_sc, SBR, SBC)
            acc_g = _qdot(a, bg, sg, acc_g, W8A8, LATE_SCALE, PRE_ROUND)
            acc_u = _qdot(a, bu, su, acc_u, W8A8, LATE_SCALE, PRE_ROUND)
            a_ptrs += BLOCK_K * s_xh
            g_ptrs += BLOCK_K * s_qk
            u_ptrs += BLOCK_K * s_qk
        if LATE_SCALE:
            acc_g *= _block_scales(s_e, offs_n, 0, mask_n, s_sr, s_sc, SBR, SBC)[None, :]
            acc_u *= _block_scales(s_e, I + offs_n, 0, mask_n, s_sr, s_sc, SBR, SBC)[None, :]
        h = acc_g * tl.sigmoid(acc_g) * acc_u
        h_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * s_hp + offs_n[None, :] * s_hi
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=mask_n[None, :])


@triton.jit
def _down_q_kernel(h_ptr, q_ptr, s_ptr, out_ptr, rows_ptr, bexp_ptr, wts_ptr, N, H, I,
                   s_hp, s_hi, s_qe, s_qn, s_qk, s_se, s_sr, s_sc, s_on, s_oh,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SBR: tl.constexpr, SBC: tl.constexpr, W8A8: tl.constexpr, LATE_SCALE: tl.constexpr,
                   PRE_ROUND: tl.constexpr):
    """out_NH[rows of block b, n-tile] = weight · (h @ down.T), down dequantized in registers."""
    pid_b = tl.program_id(0)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:
        offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
        rows = tl.load(rows_ptr + offs_m)
        valid_m = rows < N
        offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask_n = offs_n < H
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * s_hp + offs_k[None, :] * s_hi
        b_ptrs = q_ptr + e * s_qe + offs_n[None, :] * s_qn + offs_k[:, None] * s_qk
        s_e = s_ptr + e * s_se
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, tl.cdiv(I, BLOCK_K)):
            mask_k = offs_k < I - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            s_n = _block_scales(s_e, offs_n, k0 * BLOCK_K, mask_n, s_sr, s_sc, SBR, SBC)
            acc = _qdot(a, b, s_n, acc, W8A8, LATE_SCALE, PRE_ROUND)
            a_ptrs += BLOCK_K * s_hi
            b_ptrs += BLOCK_K * s_qk
        if LATE_SCALE:
            acc *= _block_scales(s_e, offs_n, 0, mask_n, s_sr, s_sc, SBR, SBC)[None, :]
        wt = tl.load(wts_ptr + rows, mask=valid_m, other=0.0)
        acc = acc * wt[:, None]
        o_ptrs = out_ptr + rows[:, None].to(tl.int64) * s_on + offs_n[None, :] * s_oh
        tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid_m[:, None] & mask_n[None, :])


def default_quant_config(T: int, K: int, E: int, dev: torch.device, w8a8: bool) -> GemmConfig:
    """Pinned tiles: the interpreter's small config on CPU; on a GPU BLOCK_N 64 (the scaled partial
    products need a second accumulator's registers), BLOCK_K 128 for w8a8 (one activation scale per
    chunk) else 64, pipeline stages shrunk to the device's shared memory."""
    if dev.type != "cuda":
        return replace(gc.INTERPRET_CONFIG, block_k=W8A8_GROUP) if w8a8 else gc.INTERPRET_CONFIG
    bm = gc.pick_block_m(T * K, E, dev)
    bk = W8A8_GROUP if w8a8 else 64
    stages = 4
    while stages > 1 and gc.shared_bytes(bm, 64, bk, stages, 2, 2) > runtime.max_shared_bytes(dev) - 8192:
        stages -= 1
    return GemmConfig(block_m=bm, block_n=64, block_k=bk, num_warps=8 if bm >= 64 else 4, num_stages=stages)


def _check_w8a8(x_TH, experts: QuantizedExperts) -> None:
    if experts.gate_up.q.dtype != FP8:
        raise ValueError(f"w8a8 multiplies fp8 by fp8: it needs an fp8 scheme, got {experts.scheme}")
    cap = runtime.capability(x_TH.device)
    if cap is not None and cap < (8, 9):
        raise ValueError(f"w8a8 needs fp8 tensor cores (sm_89+), this GPU is sm_{cap[0]}{cap[1]}")


def moe_experts_quant(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False,
                      config: GemmConfig | None = None) -> torch.Tensor:
    """:func:`dispatch.kernels.grouped_gemm.moe_experts` with quantized experts → y_TH [T, H].

    ``w8a8``: fp8 activations too (per token and 128 columns), fp8 tensor cores; fp8 schemes on
    sm_89+ only. ``config`` pins the tiles (BLOCK_K must fit the scale blocks; 128 for w8a8).
    """
    gu, dn = stand_ins(x_TH, experts)
    check_experts_input(x_TH, weights_TK, ids_TK, gu, dn)
    if w8a8:
        _check_w8a8(x_TH, experts)
    T, H = x_TH.shape
    K, E, I = ids_TK.shape[1], experts.E, experts.I
    if T == 0:
        return x_TH.new_zeros(0, H)
    if not runtime.triton_ok(x_TH) or (x_TH.device.type == "cpu" and x_TH.dtype == torch.bfloat16):
        raise ValueError(f"Triton cannot run {x_TH.dtype} on {x_TH.device} here (CUDA, or fp32/fp16 on CPU "
                         "under TRITON_INTERPRET=1)")
    cfg = config or default_quant_config(T, K, E, x_TH.device, w8a8)
    if w8a8 and cfg.block_k != W8A8_GROUP:
        raise ValueError(f"w8a8 scales activations per {W8A8_GROUP} columns: block_k must be {W8A8_GROUP}, "
                         f"got {cfg.block_k}")
    check_chunk("block_k", cfg.block_k, experts.gate_up)
    check_chunk("block_k", cfg.block_k, experts.down)
    routes = sort_by_expert(ids_TK, E, cfg.block_m)
    P, B = routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    N = T * K
    g, d = experts.gate_up, experts.down
    launch = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, W8A8=w8a8,
                  PRE_ROUND=w8a8 and x_TH.device.type == "cpu",
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    h_PI = torch.empty(P, I, device=x_TH.device, dtype=x_TH.dtype)
    _up_q_kernel[(B, triton.cdiv(I, cfg.block_n))](
        x_TH, g.q, g.scale, h_PI, routes.sorted_rows_P, routes.block_expert_B, N, H, I,
        *x_TH.stride(), *g.q.stride(), *scale_strides(g), *h_PI.stride(),
        TOP_K=K, SBR=g.block_rows, SBC=g.block_cols, LATE_SCALE=not w8a8 and g.block_cols >= H, **launch)
    wts_N = weights_TK.reshape(-1).float().contiguous()
    out_NH = torch.empty(N, H, device=x_TH.device, dtype=x_TH.dtype)
    _down_q_kernel[(B, triton.cdiv(H, cfg.block_n))](
        h_PI, d.q, d.scale, out_NH, routes.sorted_rows_P, routes.block_expert_B, wts_N, N, H, I,
        *h_PI.stride(), *d.q.stride(), *scale_strides(d), *out_NH.stride(),
        SBR=d.block_rows, SBC=d.block_cols, LATE_SCALE=not w8a8 and d.block_cols >= I, **launch)
    return combine(out_NH, K)


def moe_experts_quant_torch(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False):
    """Twin of :func:`moe_experts_quant`: per expert in fp32 on the dequantized weights; h and the
    routed rows rounded to x's dtype as the kernels store them; w8a8 rounds x and h through fp8
    (:func:`dispatch.quant.formats.fp8_activations`); k-order combine."""
    gu, dn = stand_ins(x_TH, experts)
    check_experts_input(x_TH, weights_TK, ids_TK, gu, dn)
    T, H = x_TH.shape
    K = ids_TK.shape[1]
    gu_E2IH, down_EHI = experts.dequantize(torch.float32)
    act = (lambda a: fp8_activations(a, W8A8_GROUP)) if w8a8 else (lambda a: a.float())
    ids_N = ids_TK.reshape(-1)
    out_NH = torch.zeros(T * K, H, dtype=torch.float32, device=x_TH.device)
    for e in torch.unique(ids_N).tolist():
        rows = torch.nonzero(ids_N == e).flatten()
        gate_MI, up_MI = F.linear(act(x_TH[rows // K]), gu_E2IH[e]).chunk(2, dim=-1)
        h_MI = (F.silu(gate_MI) * up_MI).to(x_TH.dtype)
        out_NH[rows] = F.linear(act(h_MI), down_EHI[e]) * weights_TK.reshape(-1)[rows, None].float()
    return combine_torch(out_NH.to(x_TH.dtype), K)
