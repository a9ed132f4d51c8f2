"""The decode path (1–64 tokens) on quantized experts: int8 or fp8 codes, dequantized in registers.

Same launches as :mod:`dispatch.kernels.gemv` (grouping inside the kernels, up+SwiGLU → down ×
weight → combine in k order; three, or one with ``DecodeConfig.fused``) and the same tiles; only the
weight loads differ: each program streams 8-bit codes — half the bytes of bf16 — plus one fp32 scale
per row and scale block, and multiplies them in: the same kernels with ``QUANT=True``
(:mod:`dispatch.kernels.quant_kernels`). Weight-only (w8a16): activations stay in x's dtype, so the
tensor cores run in bf16/fp16 (fp32 under the interpreter), and every code is converted in
registers before its MMA. ``w8a8`` (fp8 codes): x, and h between the two kernels, are quantized
to fp8 too (``fp8_rows``: one scale per token and 128 columns, whatever the weights' scales: one
scale per token would leave one program to walk a whole row of h, 14336 columns for Mixtral,
alone, before any down item could start); each 128-column chunk's product is
scaled by both scales; 16-row tiles only (``tiles.fit_w8a8``), three launches plus the two quantizing
ones. On sm_89 (Ada) the codes go to fp8 MMAs as they are loaded (``QMMA``); sm_90 (Hopper) has
fp8 MMAs only in its 64-row warpgroup form, so for these 16-row tiles Triton unpacks both operands
to fp16, two codes an instruction, and runs fp16 MMAs (``python -m dispatch_book.kernel_ir --loop``
compiles the loop offline and shows it; chapter 7): on the H200 what w8a8 decoding saves is the
weight-only path's conversion of codes to bf16, not tensor-core time.

fp8 e4m3 codes need an sm_89+ GPU (Ada, Hopper) for Triton's conversions; int8 runs everywhere
(a T4, and the CPU interpreter). Plain-PyTorch twin: :func:`moe_decode_quant_torch`.
"""
from __future__ import annotations

import torch

from dispatch import runtime, schemes
from dispatch.checks import check_experts_inputs, check_launch
from dispatch.kernels import tiles
from dispatch.kernels.gemv import by_expert_torch, moe_decode_torch, run_decode
from dispatch.kernels.quant_kernels import W8A8_GROUP, fp8_rows
from dispatch.kernels.tiles import DecodeConfig, chunk_fits, fit_w8a8
from dispatch.quant.formats import QuantizedExperts, QuantizedTensor, fp8_activations


def stand_ins(x_TH, qe) -> tuple[torch.Tensor, torch.Tensor]:
    """Zero-byte [E, 2I, H] / [E, H, I] views in x's dtype, so the unquantized validators check the
    shapes; raises ValueError for a bad ``qe``, another device, or fp8 codes on a GPU below sm_89."""
    if not isinstance(qe, QuantizedExperts):
        raise ValueError(f"experts must be a dispatch.quant.QuantizedExperts, got {type(qe).__name__}")
    if not isinstance(x_TH, torch.Tensor) or not x_TH.is_floating_point():
        raise ValueError(f"x_TH must be a floating torch.Tensor, got {getattr(x_TH, 'dtype', type(x_TH).__name__)}")
    if qe.device != x_TH.device:
        raise ValueError(f"x_TH is on {x_TH.device} but the quantized experts on {qe.device}")
    schemes.get(qe.scheme).check_device(x_TH.device)  # fp8 codes: sm_89+
    z = torch.zeros((), dtype=x_TH.dtype, device=x_TH.device)
    return z.expand(qe.gate_up.shape), z.expand(qe.down.shape)


def check_w8a8(x_TH, experts: QuantizedExperts) -> None:
    """Raise unless ``experts`` can multiply fp8 activations: fp8 codes, on sm_89+ (or the interpreter)."""
    if not schemes.get(experts.scheme).w8a8:
        raise ValueError(f"w8a8 multiplies fp8 by fp8: it needs a scheme with fp8 codes, got {experts.scheme}")
    cap = runtime.capability(x_TH.device)
    if cap is not None and cap < (8, 9):
        raise ValueError(f"w8a8 needs fp8 tensor cores (sm_89+), this GPU is sm_{cap[0]}{cap[1]}")


def fp8_act(a_MK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode kernels' w8a8 operand: a's fp8 codes and scales, per token and 128 columns."""
    return fp8_rows(a_MK, W8A8_GROUP)


def check_chunk(name: str, block: int, t: QuantizedTensor) -> None:
    """Raise unless a reduction chunk of ``block`` columns lies inside one scale block of ``t``."""
    if not chunk_fits(block, t.block_cols, t.shape[2]):
        raise ValueError(f"{name}={block} must divide the scale block of {t.block_cols} columns "
                         f"(or the block must cover all {t.shape[2]} columns)")


def quant_tiles(x_TH, K: int, experts: QuantizedExperts, w8a8: bool = False) -> DecodeConfig:
    """The tiles :func:`moe_decode_quant` takes without a config: ``tiles.resolve("decode", ...,
    scheme=...)`` — the table's for this scheme (and '+w8a8'), else the bf16 decode's, fitted to the
    scale blocks (w8a8: :func:`dispatch.kernels.tiles.fit_w8a8`'s form)."""
    (T, H), (E, _, I) = x_TH.shape, experts.down.shape  # noqa: E741
    scheme = experts.scheme + ("+w8a8" if w8a8 else "")
    return tiles.resolve("decode", (T, K, E, H, I), x_TH.dtype, x_TH.device, scheme=scheme).config


def moe_decode_quant(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False,
                     config: DecodeConfig | None = None, check_ids: bool = False,
                     activation: str = "silu") -> torch.Tensor:
    """:func:`dispatch.kernels.gemv.moe_decode` with quantized experts → y_TH [T, H] in x's dtype.

    ``experts`` from :func:`dispatch.quant.quantize_experts`, on x's device. ``config`` as for
    ``moe_decode``; its block_h / block_id must fit the scale blocks (default: the table's tiles
    for this scheme where ``python -m dispatch.tune --quant`` wrote them — the H200 table has
    int8-channel, fp8-block128 and fp8-channel for the four benchmark shapes — else the bf16
    decode's, tuned or heuristic, shrunk to fit). Bad ids as everywhere (:mod:`dispatch.checks`).
    ``w8a8`` (fp8 schemes, sm_89+): fp8 activations, fp8 × fp8 products; the table's
    '<scheme>+w8a8' decode tiles, else the weight-only ones, through ``tiles.fit_w8a8`` (a given
    ``config`` must already fit: 16-row tiles, chunks of ≥ 32, not fused).
    The kernels are the decode kernels of ``moe_decode`` with ``QUANT=True`` (and ``W8A8``).
    """
    gu, dn = stand_ins(x_TH, experts)
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gu, dn, check_ids=check_ids)
    if config is not None and not isinstance(config, DecodeConfig):
        raise ValueError(f"config must be a DecodeConfig (tiles of the decode kernels), got {type(config).__name__}")
    if w8a8:
        check_w8a8(x_TH, experts)
    check_launch("moe_decode_quant", x_TH)
    scheme = experts.scheme + ("+w8a8" if w8a8 else "")  # a given config is checked below, never altered
    cfg = tiles.resolve("decode", (T, K, E, H, I), x_TH.dtype, x_TH.device, scheme=scheme, config=config).config
    if w8a8 and cfg != fit_w8a8(cfg):
        raise ValueError(f"w8a8 decode runs fp8 MMAs in three launches: block_m ≥ 16, block_h and block_id "
                         f"32 to {W8A8_GROUP}, fused=0; got {cfg}")
    check_chunk("block_h", cfg.block_h, experts.gate_up)
    check_chunk("block_id", cfg.block_id, experts.down)
    if cfg.split:  # a split item's down products sum over its I tile only
        check_chunk("block_i", cfg.block_i, experts.down)
    if T == 0:
        return x_TH.new_empty(0, H)
    return run_decode(x_TH, weights_TK, ids_TK, experts.gate_up, experts.down, cfg, act=fp8_act if w8a8 else None,
                      activation=activation)


def moe_decode_quant_torch(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False,
                           activation: str = "silu"):
    """Twin of :func:`moe_decode_quant`: ``moe_decode_torch`` in fp32 on the dequantized weights;
    ``w8a8``: x and h rounded through fp8 per token and 128 columns first, as the kernels see them."""
    gu, dn = stand_ins(x_TH, experts)
    check_experts_inputs(x_TH, weights_TK, ids_TK, gu, dn)
    gu_E2IH, down_EHI = experts.dequantize(torch.float32)
    if w8a8:
        return by_expert_torch(x_TH, weights_TK, ids_TK, gu_E2IH, down_EHI,
                               act=lambda a: fp8_activations(a, W8A8_GROUP), activation=activation)
    return moe_decode_torch(x_TH.float(), weights_TK, ids_TK, gu_E2IH, down_EHI, activation=activation).to(x_TH.dtype)


def quant_bytes_read(ids_TK: torch.Tensor, experts: QuantizedExperts) -> int:
    """Bytes of quantized expert weights one decode step reads: distinct experts × (codes + scales)."""
    return int(torch.unique(ids_TK).numel()) * experts.nbytes() // experts.E
