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
from torch.library import custom_op

from dispatch import activations
from dispatch.checks import check_experts_inputs, check_launch, no_backward, via_op
from dispatch.kernels import pdl, tiles, tma
from dispatch.kernels.combine import combine_impl
from dispatch.kernels.grouped_kernels import _down_kernel, _down_tile, _swizzle, _up_swiglu_kernel, _up_tile  # noqa: F401
from dispatch.kernels.quant_kernels import fp8_rows, weight_first, weight_operand
from dispatch.kernels.sort import sort_by_expert
from dispatch.kernels.tiles import GemmConfig
from dispatch.reference import gated_act


def _even_k(kdim_name):
    return {"EVEN_K": lambda a: a[kdim_name] % a["BLOCK_K"] == 0}


_up_pinned = triton.heuristics(_even_k("H"))(_up_swiglu_kernel)
_down_pinned = triton.heuristics(_even_k("I"))(_down_kernel)


def _operand(t: torch.Tensor) -> tuple:
    """A tensor as the kernels take an operand: (pointer, its strides)."""
    return (t, *t.stride())


def _launch(kernel, kind, grid_fn, args, block_m, config: GemmConfig | None, shape, views, **const):
    """Launch with ``config``, else the tile resolver's for ``shape`` = (T, K, E, H, I, dtype, device).

    ``views``: the 2-D tensors the kernel may read by TMA, {argument name: (tensor, 'm' or 'n': box rows)};
    passed as descriptors (``TMA=True``) where :func:`dispatch.kernels.tma.descriptors` allows, else as
    plain tensors the kernel ignores."""
    config = tiles.resolve(kind, shape[:5], shape[5], shape[6], block_m=block_m, config=config).config
    meta = {"BLOCK_N": config.block_n, "BLOCK_K": config.block_k}
    descs = tma.descriptors(views.values(), block_m, config.block_n, config.block_k, shape[6])
    use = descs is not None
    descs = dict(zip(views, descs if use else [args[1][0]] * len(views), strict=True))  # else: never read
    kernel[grid_fn(meta)](*args, BLOCK_M=block_m, **meta, **const, **descs, GROUP_M=config.group_m,
                          TMA=use, num_warps=config.num_warps, num_stages=config.num_stages,
                          **pdl.launch_kw(shape[6], late=True))  # several waves: release at the end


def _activations(a: torch.Tensor, w8a8: bool, quant: dict, **used) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(operand, its scales, their row stride): a itself (scales never read), or w8a8's fp8 rows:
    one scale per token where the weights have one per row (``LATE_SCALE``), else per 128 columns;
    ``used``: h's slots in used blocks only (``fp8_rows``' used_blocks_1, block_rows)."""
    if not w8a8:
        return a, a, 0
    q, s = fp8_rows(a, None if quant["LATE_SCALE"] else 128, **used)
    return q, s, s.stride(0)


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


def grouped_up_swiglu(x_TH: torch.Tensor, routes, gate_up_E2IH, *, config: GemmConfig | None = None,
                      w8a8: bool = False, activation: str = "silu") -> torch.Tensor:
    """Up-projection of every sorted slot with the gated activation fused (``activation``:
    :mod:`dispatch.activations`, SwiGLU by default): → h_PI (x's dtype; padding slots → 0).

    x_TH [T, H] (any strides), routes from ``sort_by_expert(ids_TK, E, block_m)``,
    gate_up_E2IH [E, 2I, H] (rows 0..I-1 gate, I..2I-1 up). Slots of unused blocks are left unwritten.
    Quantized weights (a ``dispatch.quant.QuantizedTensor``, chapter 7) need a pinned ``config``
    whose block_k fits their scale blocks; ``w8a8``: fp8 activations too (fp8 codes only).
    """
    if x_TH.dim() != 2 or len(gate_up_E2IH.shape) != 3:
        raise ValueError(f"x must be [T, H] and gate_up [E, 2I, H], got {tuple(x_TH.shape)} and "
                         f"{tuple(gate_up_E2IH.shape)}")
    T, H = x_TH.shape
    E, I2, H2 = gate_up_E2IH.shape
    if H2 != H or I2 % 2:
        raise ValueError(f"gate_up must be [E, 2I, H={H}], got {tuple(gate_up_E2IH.shape)}")
    if isinstance(gate_up_E2IH, torch.Tensor) and gate_up_E2IH.dtype != x_TH.dtype:  # codes: any 8-bit dtype
        raise ValueError(f"x is {x_TH.dtype} but gate_up is {gate_up_E2IH.dtype}")
    check_launch("grouped_up_swiglu", x_TH)
    if routes.num_tokens != T or routes.num_experts != E:
        raise ValueError(f"routes were sorted for T={routes.num_tokens} tokens and E={routes.num_experts} experts, "
                         f"but x has T={T} and gate_up E={E}")
    I, N = I2 // 2, routes.slot_of_N.numel()
    if T == 0 or N % T:
        raise ValueError(f"routes describe N={N} routed rows, not a multiple of T={T} tokens (need T > 0)")
    top_k = N // T
    act = activations.get(activation).code
    bm = _check_routes(routes, N, config.block_m if config else None)
    P, B = routes.sorted_rows_P.numel(), routes.block_expert_B.numel()
    h_PI = torch.empty(P, I, device=x_TH.device, dtype=x_TH.dtype)
    w, s, s_strides, quant = weight_operand(gate_up_E2IH, w8a8)
    a, a_s, s_as = _activations(x_TH, w8a8, quant)
    args = (_operand(a), _operand(w), _operand(h_PI), (s, *s_strides), (a_s, s_as),
            routes.sorted_rows_P, routes.block_expert_B, N, H, I, tiles.next_pow2(N))
    _launch(_up_pinned, "up", lambda m: (B, triton.cdiv(I, m["BLOCK_N"])), args, bm, config,
            (T, top_k, E, H, I, x_TH.dtype, x_TH.device), {"w_desc": (tma.rows_view(w), "n")}, TOP_K=top_k,
            **quant, W8A8=w8a8, WFIRST=weight_first(quant, w8a8), ACT=act)
    return h_PI


def grouped_down(h_PI: torch.Tensor, routes, down_EHI, weights_TK: torch.Tensor, *,
                 config: GemmConfig | None = None, w8a8: bool = False, zero_skipped: bool = True) -> torch.Tensor:
    """Down-projection times the routing weight, stored at routed row n = t·K + k: → out_NH.

    h_PI [P, I] from :func:`grouped_up_swiglu`, down_EHI [E, H, I], weights_TK [T, K] (any float;
    applied in fp32 to the fp32 accumulator, one cast on store). Quantized weights as there.
    A row whose id lies outside [0, E) is computed nowhere and is zero (``zero_skipped=False``:
    left unwritten, one memset less, for callers that combine with ids and time the kernel alone).
    """
    if h_PI.dim() != 2 or len(down_EHI.shape) != 3:
        raise ValueError(f"h must be [P, I] and down [E, H, I], got {tuple(h_PI.shape)} and {tuple(down_EHI.shape)}")
    P, I = h_PI.shape
    E, H, I2 = down_EHI.shape
    if I2 != I:
        raise ValueError(f"down must be [E, H, I={I}], got {tuple(down_EHI.shape)}")
    if isinstance(down_EHI, torch.Tensor) and down_EHI.dtype != h_PI.dtype:
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
    out_NH = (torch.zeros if zero_skipped else torch.empty)(N, H, device=h_PI.device, dtype=h_PI.dtype)
    w, s, s_strides, quant = weight_operand(down_EHI, w8a8)
    a, a_s, s_as = _activations(h_PI, w8a8, quant, used_blocks_1=routes.num_blocks_1, block_rows=bm)
    args = (_operand(a), _operand(w), _operand(out_NH), (s, *s_strides), (a_s, s_as),
            routes.sorted_rows_P, routes.block_expert_B, wts_N, N, H, I, tiles.next_pow2(N))
    _launch(_down_pinned, "down", lambda m: (B, triton.cdiv(H, m["BLOCK_N"])), args, bm, config,
            (routes.num_tokens, routes.top_k, E, H, I, h_PI.dtype, h_PI.device),
            {"h_desc": (a, "m"), "w_desc": (tma.rows_view(w), "n")}, **quant, W8A8=w8a8,
            WFIRST=weight_first(quant, w8a8))
    return out_NH


def moe_experts(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, config: GemmConfig | None = None,
                configs: tuple[GemmConfig, GemmConfig] | None = None, check_ids: bool = False,
                activation: str = "silu") -> torch.Tensor:
    """The routed experts: sort → grouped up + gated activation → grouped down×weight → combine → y_TH [T, H].

    Same math as ``reference.experts_reference``; fp32 accumulation everywhere, a token's K
    contributions summed in k order. ``config`` pins all tile sizes (rows then do not depend on
    each other: bitwise the same whether computed alone or in a batch); ``configs`` = (up, down) pins
    each kernel's own (same block_m). Default: :func:`dispatch.kernels.tiles.resolve`. Ids outside
    [0, E) add nothing (``check_ids=True``: raise instead, one host sync); see :mod:`dispatch.checks`.
    Registered as ``torch.ops.dispatch.moe_experts`` (``torch.compile`` keeps it whole; no backward).
    ``activation``: the experts' gated activation (:mod:`dispatch.activations`; SwiGLU by default).
    """
    check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)
    if config is not None and configs is not None:
        raise ValueError("pass config (one for both kernels) or configs (up, down), not both")
    pinned = (config, config) if config is not None else configs
    if pinned is not None:
        if len(pinned) != 2 or not all(isinstance(c, GemmConfig) for c in pinned):
            raise ValueError(f"config must be a GemmConfig and configs a pair (up, down) of them, got {pinned!r}")
        if pinned[0].block_m != pinned[1].block_m:
            raise ValueError(f"up and down configs must share block_m, got {pinned[0].block_m} and {pinned[1].block_m}")
    act = activations.get(activation).code
    check_launch("moe_experts", x_TH)
    tile_ints = [v for c in pinned for v in dataclasses.astuple(c)] if pinned is not None else None
    op = torch.ops.dispatch.moe_experts if via_op(x_TH, weights_TK, gate_up_E2IH, down_EHI) else _moe_experts_impl
    return op(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, tile_ints, act)


def _moe_experts_impl(x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor, gate_up_E2IH: torch.Tensor,
                      down_EHI: torch.Tensor, tile_ints: list[int] | None, act: int) -> torch.Tensor:
    """The launches behind :func:`moe_experts` (inputs checked; ``tile_ints``: up then down config, or None)."""
    (T, H), (K, E) = x_TH.shape, (ids_TK.shape[1], gate_up_E2IH.shape[0])
    if T == 0:
        return x_TH.new_zeros(0, H)
    n = len(dataclasses.fields(GemmConfig))
    configs = (GemmConfig(*tile_ints[:n]), GemmConfig(*tile_ints[n:])) if tile_ints is not None else None
    up, down = tiles.resolve("grouped", (T, K, E, H, down_EHI.shape[2]), x_TH.dtype, x_TH.device,
                             config=configs).config
    routes = sort_by_expert(ids_TK, E, up.block_m)
    h_PI = grouped_up_swiglu(x_TH, routes, gate_up_E2IH, config=up, activation=activations.by_code(act).name)
    out_NH = grouped_down(h_PI, routes, down_EHI, weights_TK, config=down, zero_skipped=False)
    return combine_impl(out_NH, K, ids_TK, E, out_NH.dtype)


_moe_experts_op = custom_op("dispatch::moe_experts", _moe_experts_impl, mutates_args=())


@_moe_experts_op.register_fake
def _(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, tile_ints, act):
    return torch.empty_like(x_TH)


no_backward(_moe_experts_op, "dispatch.kernels.grouped_gemm.moe_experts")


# ---- plain-PyTorch twins (what the kernels compute, slot by slot) ----

def grouped_up_swiglu_torch(x_TH, routes, gate_up_E2IH, *, activation: str = "silu") -> torch.Tensor:
    """Twin of :func:`grouped_up_swiglu`: h_PI with padding slots (and unused blocks) zero.

    One expert at a time (its weights used in place, never copied per row): fp32 products,
    the gated activation in fp32, one rounding to x's dtype, as the kernel does.
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
        up_M2I = x_TH[rows_P[slots] // (N // T)].float() @ gate_up_E2IH[e].float().T
        h_PI[slots] = gated_act(up_M2I, activation).to(x_TH.dtype)
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
