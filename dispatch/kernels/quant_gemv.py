"""The decode path (1–64 tokens) on quantized experts: int8 or fp8 codes, dequantized in registers.

Same three launches as :mod:`dispatch.kernels.gemv` (grouping inside the kernels, up+SwiGLU → down ×
weight → combine in k order) and the same tiles; only the weight loads differ: each program streams
8-bit codes — half the bytes of bf16 — plus one fp32 scale per row and scale block, and multiplies
them in (see :mod:`dispatch.kernels.quant_kernels`). Weight-only (w8a16): activations stay in x's
dtype, so the tensor cores run in bf16/fp16 (fp32 under the interpreter).

fp8 e4m3 codes need an sm_89+ GPU (Ada, Hopper) for Triton's conversions; int8 runs everywhere
(a T4, and the CPU interpreter). Plain-PyTorch twin: :func:`moe_decode_quant_torch`.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton

from dispatch import runtime
from dispatch.kernels.checks import check_experts_inputs
from dispatch.kernels.combine import combine_impl
from dispatch.kernels.gemv import DecodeConfig, default_config, moe_decode_torch
from dispatch.kernels.quant_kernels import _down_q_kernel, _up_swiglu_q_kernel
from dispatch.quant.formats import FP8, QuantizedExperts, QuantizedTensor


def stand_ins(x_TH, qe) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-byte [E, 2I, H] / [E, H, I] views in x's dtype, so the unquantized validators check the
    shapes; raises ValueError for a bad ``qe``, another device, or fp8 codes on a GPU below sm_89."""
    if not isinstance(qe, QuantizedExperts):
        raise ValueError(f"experts must be a dispatch.quant.QuantizedExperts, got {type(qe).__name__}")
    if not isinstance(x_TH, torch.Tensor) or not x_TH.is_floating_point():
        raise ValueError(f"x_TH must be a floating torch.Tensor, got {getattr(x_TH, 'dtype', type(x_TH).__name__)}")
    if qe.device != x_TH.device:
        raise ValueError(f"x_TH is on {x_TH.device} but the quantized experts on {qe.device}")
    cap = runtime.capability(x_TH.device)
    if qe.gate_up.q.dtype == FP8 and cap is not None and cap < (8, 9):
        raise ValueError(f"fp8 e4m3 codes need an sm_89+ GPU (Ada, Hopper); this one is sm_{cap[0]}{cap[1]}: "
                         "use an int8 scheme")
    z = torch.zeros((), dtype=x_TH.dtype, device=x_TH.device)
    return z.expand(qe.gate_up.shape), z.expand(qe.down.shape)


def check_chunk(name: str, block: int, t: QuantizedTensor) -> None:
    """A reduction chunk of ``block`` columns must lie inside one scale block of ``t``."""
    cols = t.shape[2]
    if not (t.block_cols >= cols or t.block_cols % block == 0):
        raise ValueError(f"{name}={block} must divide the scale block of {t.block_cols} columns "
                         f"(or the block must cover all {cols} columns)")


def fit_scales(cfg: DecodeConfig, qe: QuantizedExperts) -> DecodeConfig:
    """``cfg`` with its reduction chunks shrunk to fit inside the scale blocks (group-128, 128×128)."""
    def fit(block, t):
        while not (t.block_cols >= t.shape[2] or t.block_cols % block == 0) and block > 16:
            block //= 2
        return block
    return replace(cfg, block_h=fit(cfg.block_h, qe.gate_up), block_id=fit(cfg.block_id, qe.down))


def scale_strides(t: QuantizedTensor) -> tuple[int, int, int]:
    return t.scale.stride(0), t.scale.stride(1), t.scale.stride(2)


def moe_decode_quant(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, config: DecodeConfig | None = None,
                     check_ids: bool | None = None) -> torch.Tensor:
    """:func:`dispatch.kernels.gemv.moe_decode` with quantized experts → y_TH [T, H] in x's dtype.

    ``experts`` from :func:`dispatch.quant.quantize_experts`, on x's device. ``config`` as for
    ``moe_decode``; its block_h / block_id must fit the scale blocks (default: shrunk to fit).
    """
    gu, dn = stand_ins(x_TH, experts)
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gu, dn)
    if check_ids is None:
        check_ids = x_TH.device.type == "cpu"
    if check_ids and T and not bool(((ids_TK >= 0) & (ids_TK < E)).all()):
        raise ValueError(f"ids_TK must hold expert ids in [0, {E}), got min {int(ids_TK.min())} "
                         f"max {int(ids_TK.max())}")
    cfg = config or fit_scales(default_config(T, K, E, H, I, x_TH.device), experts)
    check_chunk("block_h", cfg.block_h, experts.gate_up)
    check_chunk("block_id", cfg.block_id, experts.down)
    y_TH = torch.empty(T, H, dtype=x_TH.dtype, device=x_TH.device)
    if T == 0:
        return y_TH
    if x_TH.stride(1) != 1:
        x_TH = x_TH.contiguous()
    gq, dq = experts.gate_up.q.contiguous(), experts.down.q.contiguous()
    N = T * K
    slots = min(E, N)
    BLOCK_E = max(16, triton.next_power_of_2(E))
    CHUNK_N = max(16, min(triton.next_power_of_2(N), 8192 // BLOCK_E))
    h_NI = torch.empty(N, I, dtype=x_TH.dtype, device=x_TH.device)
    out_NH = torch.empty(N, H, dtype=torch.float32, device=x_TH.device)
    g, d = experts.gate_up, experts.down
    _up_swiglu_q_kernel[(slots, cfg.tiles_per_slot(slots, triton.cdiv(I, cfg.block_i)))](
        x_TH, ids_TK, gq, g.scale, h_NI, N, K, E, H, I,
        x_TH.stride(0), ids_TK.stride(0), ids_TK.stride(1), gq.stride(0), gq.stride(1), *scale_strides(g),
        h_NI.stride(0), SBR=g.block_rows, SBC=g.block_cols, LATE_SCALE=g.block_cols >= H,
        BLOCK_M=cfg.block_m, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_E=BLOCK_E, CHUNK_N=CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    _down_q_kernel[(slots, cfg.tiles_per_slot(slots, triton.cdiv(H, cfg.block_ho)))](
        h_NI, ids_TK, weights_TK, dq, d.scale, out_NH, N, K, E, H, I,
        ids_TK.stride(0), ids_TK.stride(1), weights_TK.stride(0), weights_TK.stride(1),
        dq.stride(0), dq.stride(1), *scale_strides(d), h_NI.stride(0), out_NH.stride(0),
        SBR=d.block_rows, SBC=d.block_cols, LATE_SCALE=d.block_cols >= I,
        BLOCK_M=cfg.block_m, BLOCK_HO=cfg.block_ho, BLOCK_I=cfg.block_id, BLOCK_E=BLOCK_E, CHUNK_N=CHUNK_N,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps)
    return combine_impl(out_NH, K, ids_TK, E, x_TH.dtype)


def moe_decode_quant_torch(x_TH, weights_TK, ids_TK, experts: QuantizedExperts) -> torch.Tensor:
    """Twin of :func:`moe_decode_quant`: ``moe_decode_torch`` in fp32 on the dequantized weights."""
    stand_ins(x_TH, experts)
    gu_E2IH, down_EHI = experts.dequantize(torch.float32)
    return moe_decode_torch(x_TH.float(), weights_TK, ids_TK, gu_E2IH, down_EHI).to(x_TH.dtype)


def quant_bytes_read(ids_TK: torch.Tensor, experts: QuantizedExperts) -> int:
    """Bytes of quantized expert weights one decode step reads: distinct experts × (codes + scales)."""
    return int(torch.unique(ids_TK).numel()) * experts.nbytes() // experts.E
