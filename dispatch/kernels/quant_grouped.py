"""Grouped GEMM on quantized experts: w8a16 (int8 / fp8 codes) and fp8 w8a8 (sm_89+).

The schedule of :mod:`dispatch.kernels.grouped_gemm` (sort by expert → one program per (block of
BLOCK_M sorted rows, column tile) → combine in k order), with the weight tiles read as 8-bit codes
and dequantized in registers: the grouped GEMM's own kernels with ``QUANT=True``
(:mod:`dispatch.kernels.quant_kernels`):

    w8a16  codes → x's dtype (exact), bf16/fp16 tensor cores, × the scale of each column's block
    w8a8   fp8 e4m3 codes and activations quantized before each GEMM (``fp8_rows``): one scale per
           token and 128 columns (BLOCK_K = 128) for block-scaled weights, one per token for
           per-channel weights (then the scales are applied once, after the reduction); fp8
           tensor cores: twice the bf16 peak on an H100/H200 (sm_89+; under the interpreter the
           activations are rounded to e4m3 in fp32 first: ``_e4m3_round``)

Plain-PyTorch twin: :func:`moe_experts_quant_torch` (per expert, fp32, the same activation rounding).
"""
from __future__ import annotations

import torch

from dispatch.checks import check_experts_inputs, check_launch
from dispatch.kernels import tiles
from dispatch.kernels.combine import combine_impl
from dispatch.kernels.gemv import by_expert_torch
from dispatch.kernels.grouped_gemm import grouped_down, grouped_up_swiglu
from dispatch.kernels.quant_gemv import check_chunk, check_w8a8, stand_ins
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import W8A8_GROUP, GemmConfig
from dispatch.quant.formats import QuantizedExperts, fp8_activations


def moe_experts_quant(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False,
                      config: GemmConfig | tuple[GemmConfig, GemmConfig] | None = None,
                      check_ids: bool = False, activation: str = "silu") -> torch.Tensor:
    """:func:`dispatch.kernels.grouped_gemm.moe_experts` with quantized experts → y_TH [T, H].

    ``w8a8``: fp8 activations too (per token and 128 columns; per token with per-channel weights),
    fp8 tensor cores; fp8 schemes on sm_89+ only. ``config`` pins the tiles, one GemmConfig for both
    kernels or an (up, down) pair sharing block_m (BLOCK_K must fit the scale blocks; 128 for w8a8
    with block scales).
    Bad ids as everywhere (:mod:`dispatch.checks`).
    """
    gu, dn = stand_ins(x_TH, experts)
    T, K, E, H, I = check_experts_inputs(x_TH, weights_TK, ids_TK, gu, dn, check_ids=check_ids)
    if w8a8:
        check_w8a8(x_TH, experts)
    if T == 0:
        return x_TH.new_zeros(0, H)
    check_launch("moe_experts_quant", x_TH)
    up, down = quant_configs(T, K, E, H, I, x_TH, experts, w8a8, config)
    routes = sort_by_expert(ids_TK, E, up.block_m)
    h_PI = grouped_up_swiglu(x_TH, routes, experts.gate_up, config=up, w8a8=w8a8, activation=activation)
    out_NH = grouped_down(h_PI, routes, experts.down, weights_TK, config=down, w8a8=w8a8, zero_skipped=False)
    return combine_impl(out_NH, K, ids_TK, E, out_NH.dtype)  # rows with ids outside [0, E): selected away


def quant_configs(T, K, E, H, I, x_TH, experts: QuantizedExperts, w8a8: bool,  # noqa: E741
                  config=None) -> tuple[GemmConfig, GemmConfig]:
    """(up, down) tiles, checked: ``config`` (one GemmConfig for both, or a pair), else
    ``tiles.resolve("grouped", ..., scheme=...)`` (the GPU's table's w8a8 entries, else the pinned
    defaults of ``tile_rules.heuristic_quant_gemm``)."""
    late = experts.gate_up.per_row and experts.down.per_row
    if config is not None and not (isinstance(config, GemmConfig) or (
            isinstance(config, tuple | list) and len(config) == 2 and all(isinstance(c, GemmConfig) for c in config))):
        raise ValueError(f"config must be a GemmConfig or an (up, down) pair of them, got {config!r}")
    scheme = experts.scheme + ("+w8a8" if w8a8 else "")
    up, down = tiles.resolve("grouped", (T, K, E, H, I), x_TH.dtype, x_TH.device, scheme=scheme, config=config).config
    if up.block_m != down.block_m:
        raise ValueError(f"up and down tiles must share block_m (the sort's), got {up.block_m} and {down.block_m}")
    for name, cfg, t in (("up", up, experts.gate_up), ("down", down, experts.down)):
        if w8a8 and not late and cfg.block_k != W8A8_GROUP:
            raise ValueError(f"w8a8 scales activations per {W8A8_GROUP} columns: block_k must be {W8A8_GROUP}, "
                             f"got {cfg.block_k} ({name})")
        check_chunk("block_k", cfg.block_k, t)
    return up, down


def moe_experts_quant_torch(x_TH, weights_TK, ids_TK, experts: QuantizedExperts, *, w8a8: bool = False,
                            activation: str = "silu"):
    """Twin of :func:`moe_experts_quant`: per expert in fp32 on the dequantized weights; h and the
    routed rows rounded to x's dtype as the kernels store them; w8a8 rounds x and h through fp8
    (:func:`dispatch.quant.formats.fp8_activations`); k-order combine."""
    gu, dn = stand_ins(x_TH, experts)
    check_experts_inputs(x_TH, weights_TK, ids_TK, gu, dn)
    gu_E2IH, down_EHI = experts.dequantize(torch.float32)
    # as the kernels: per token where the weight it meets has one scale a row (LATE_SCALE), else per 128
    t_of = {experts.H: experts.gate_up, experts.I: experts.down}  # H == I: both tensors decide alike
    act = (lambda a: fp8_activations(a, None if t_of[a.shape[1]].per_row else W8A8_GROUP)) if w8a8 else None
    return by_expert_torch(x_TH, weights_TK, ids_TK, gu_E2IH, down_EHI, act=act, row_dtype=x_TH.dtype,
                           activation=activation)
