"""The decode path in one launch with no item waiting on another: each item takes one I tile of one
expert through the whole expert (up, SwiGLU, down), and a short reduction sums the tiles at the end.

The chain (:mod:`dispatch.kernels.gemv`) and the one launch of :mod:`dispatch.kernels.decode_fused`
both need all of an expert's h before any of its down rows: SwiGLU mixes nothing across I, but the
down projection sums over all of I. At a token or two that ordering costs a boundary in the middle
of a read of ~100 MB (the down items wait, or the down kernel starts only once the last up program
is done). Splitting the sum over I removes it (split-K over I, as Flash-Decoding splits attention
over the keys):

1. a *split item* (slot, I tile) computes h for the tile's ``block_i`` columns (the chain's own
   ``_up_item``: gate and up rows streamed over H, SwiGLU, h rounded to x's dtype) and at once the
   tile's share of every output column, P[n, tile, :] = h[n, tile] @ down[:, tile].T (fp32; down's
   ``block_i`` columns streamed over H in chunks of ``block_ho``). Every item reads 3·block_i·H
   weights and waits for nothing;
2. after the last split item, *reduce items* (``R_COLS`` output columns each) sum the tiles in
   order and the K weighted rows of each token in k order: y[t] = Σ_k w[t, k] · Σ_tile P[t·K + k, tile],
   fp32, cast once (rows whose id is outside [0, E) are selected away). They are handed out after
   every split item and wait for a counter, as the one launch's down items wait for their slot.

The partial sums cost N × I/block_i × H × 4 bytes written and read back (from L2 at a few tokens: at
one token of OLMoE with block_i 32, 2 MiB beside 100 MB of weights): a path for small T, which the
tuner tries at T ≤ ``SPLIT_MAX_T``. Deterministic (fixed orders, bitwise from run to run); not bitwise
the chain's (a sum of per-tile partial sums rounds differently from one running sum over I).
Weights bf16/fp16/fp32 or weight-only quantized (w8a8 decode runs the chain). Shared experts ride
along as in the chain. Launcher: :func:`split_launch`, which :func:`dispatch.kernels.gemv.run_decode` calls
with ``DecodeConfig.split``.
Twin: :func:`dispatch.kernels.gemv.moe_decode_torch`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.kernels import decode_fused, pdl
from dispatch.kernels import trace as trace_rows
from dispatch.kernels.decode_fused import _wait_for, weight_consts
from dispatch.kernels.gemv_kernels import GROUPS as GROUPS  # the fields of this module's tuple arguments
from dispatch.kernels.gemv_kernels import (
    _expert_counts,
    _late_scales,
    _rows_of_expert,
    _slot_expert,
    _tile_acc,
    _tile_mac,
    _tile_out,
    _up_item,
)
from dispatch.kernels.helpers import routed_ok
from dispatch.kernels.pdl import pdl_enter, pdl_exit
from dispatch.kernels.quant_kernels import _block_scales
from dispatch.kernels.trace import record, stamp

SPLIT_MAX_T = 16  # the tuner tries split items up to here (the partial sums grow with T·K)
R_COLS = 32  # output columns of a reduce item


@triton.jit
def _partial_item(item, tiles, count_E, slot_E,  # the item; the expert counts and slots (_expert_counts)
                  h, ids, down, p_ptr, dims,  # operands (gemv_kernels.GROUPS), the partial sums; (N, K, E, H, I)
                  SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, LATE_SCALE: tl.constexpr,  # down's format
                  BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_HO: tl.constexpr, BLOCK_E: tl.constexpr,
                  CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NS: tl.constexpr):  # tiles, shared experts
    """P[rows of the slot's expert, tile, :] = h[rows, I tile] @ down[:, I tile].T, fp32, for the item
    (slot, I tile) = divmod(item, tiles) whose h this program has just stored (read back after a barrier)."""
    h_ptr, stride_hn = h
    dn_ptr, stride_de, stride_dh, ds_ptr, stride_dse, stride_dsr, stride_dsc, sdn_ptr, stride_sdh = down
    N, K, E, H, I = dims
    e, count = _slot_expert(count_E, slot_E, item // tiles, BLOCK_E)
    tile = item % tiles
    s_e = ds_ptr + e.to(tl.int64) * stride_dse
    offs_i = tile * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    base, s_row = dn_ptr + e.to(tl.int64) * stride_de, stride_dh  # the expert's [H, I], its row stride
    if NS > 0:  # shared expert E + j: columns j·I .. of the shared down [H, S]
        base = tl.where(e >= E, sdn_ptr + ((e - E) * I).to(tl.int64), base)
        s_row = tl.where(e >= E, stride_sdh, s_row)
    down_ptr = base + offs_i[:, None]  # [BLOCK_I, 1], I contiguous
    for m0 in range(0, count, BLOCK_M):
        rows_M, valid_M = _rows_of_expert(ids, N, K, E, NS, e, count, m0, BLOCK_M, CHUNK_N)
        h_MI = tl.load(h_ptr + rows_M.to(tl.int64)[:, None] * stride_hn + offs_i[None, :],  # this program's stores
                       mask=valid_M[:, None] & mask_i[None, :], other=0.0)
        p_row = p_ptr + (rows_M.to(tl.int64) * tiles + tile)[:, None] * H
        for o0 in tl.range(0, H, BLOCK_HO, num_stages=NUM_STAGES):
            offs_o = o0 + tl.arange(0, BLOCK_HO)
            mask_o = offs_o < H
            d_IO = tl.load(down_ptr + offs_o[None, :] * s_row, mask=mask_i[:, None] & mask_o[None, :], other=0.0)
            s_O = _block_scales(s_e, offs_o, tile * BLOCK_I, mask_o, stride_dsr, stride_dsc, SBR, SBC, QUANT)
            acc = _tile_mac(h_MI, 1.0, d_IO, s_O, _tile_acc(BLOCK_M, BLOCK_I, BLOCK_HO), BLOCK_M, QUANT, False,
                            LATE_SCALE)  # no activation scales: not W8A8
            acc = _late_scales(_tile_out(acc, BLOCK_M), s_e, offs_o, mask_o, stride_dsr, stride_dsc, SBR, SBC, QUANT,
                               False, LATE_SCALE)
            tl.store(p_row + offs_o[None, :], acc, mask=valid_M[:, None] & mask_o[None, :])


@triton.jit
def _tile_part(p, j, H, m, tiles, BLOCK_T: tl.constexpr):
    """Tile j's partial sums at p (zeros past the last tile): one load of a reduce item."""
    in_range = tl.full([BLOCK_T], j, tl.int32) < tiles
    return tl.load(p + j * H, mask=m & in_range[:, None], other=0.0, cache_modifier=".cg")


@triton.jit
def _reduce_cols(p_ptr, w, ids, y, T, K, E, H, tiles, r_tile, NS: tl.constexpr, BLOCK_T: tl.constexpr,
                 BLOCK_R: tl.constexpr):
    """y_TH[:, the R_COLS tile] = Σ_k w[t, k] · Σ_tile P[t·(K+NS) + k, tile] (tiles in order, then k in
    order; fp32, one cast). A routed row whose id is outside [0, E) was never written: selected away."""
    w_ptr, stride_wt, stride_wk = w
    ids_ptr, stride_it, stride_ik = ids
    y_ptr, stride_yt = y
    offs_o = r_tile * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_o = offs_o < H
    for t0 in range(0, T, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        mask_t = offs_t < T
        acc = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
        for k in range(0, K + NS):  # fixed k order; the NS shared experts' rows (k ≥ K: weight 1) last
            ok = routed_ok(ids_ptr, offs_t, mask_t, k, K, E, stride_it, stride_ik)
            routed = tl.full([BLOCK_T], k, tl.int32) < K  # the shared rows' weight is 1
            w_T = tl.load(w_ptr + offs_t * stride_wt + k * stride_wk, mask=ok & routed, other=1.0).to(tl.float32)
            p = p_ptr + ((offs_t * (K + NS) + k).to(tl.int64) * tiles)[:, None] * H + offs_o[None, :]
            row = tl.zeros([BLOCK_T, BLOCK_R], dtype=tl.float32)
            for j in range(0, tiles, 8):  # eight loads in flight (latency, not bandwidth), added in tile order
                m = ok[:, None] & mask_o[None, :]
                a0, a1 = _tile_part(p, j, H, m, tiles, BLOCK_T), _tile_part(p, j + 1, H, m, tiles, BLOCK_T)
                a2, a3 = _tile_part(p, j + 2, H, m, tiles, BLOCK_T), _tile_part(p, j + 3, H, m, tiles, BLOCK_T)
                a4, a5 = _tile_part(p, j + 4, H, m, tiles, BLOCK_T), _tile_part(p, j + 5, H, m, tiles, BLOCK_T)
                a6, a7 = _tile_part(p, j + 6, H, m, tiles, BLOCK_T), _tile_part(p, j + 7, H, m, tiles, BLOCK_T)
                row += a0
                row += a1
                row += a2
                row += a3
                row += a4
                row += a5
                row += a6
                row += a7
            acc += tl.where(ok[:, None], row * w_T[:, None], 0.0)
        tl.store(y_ptr + offs_t.to(tl.int64)[:, None] * stride_yt + offs_o[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mask_t[:, None] & mask_o[None, :])


@triton.jit
def _split_decode_kernel(x, ids, w, gate_up, down, h, y, dims, T,  # operands (gemv_kernels.GROUPS), tokens
                         p_ptr, ws_ptr, trace_ptr,  # the partial sums, the int32 counters, the trace rows
                         G: tl.constexpr, D: tl.constexpr,  # gate/up's and down's (SBR, SBC, QUANT, LATE_SCALE)
                         BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
                         BLOCK_HO: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr,
                         NUM_STAGES: tl.constexpr, NS: tl.constexpr, BLOCK_T: tl.constexpr,
                         BLOCK_R: tl.constexpr,  # tiles, shared experts, the reduce items' token and column blocks
                         PDL: tl.constexpr, ACT: tl.constexpr, TRACE: tl.constexpr = False):
    """Split items, then reduce items, by ticket (the module's docstring). ws[0]: the ticket, ws[1]:
    programs that have left, ws[2]: split items done. TRACE: row ``ticket``, kind 2 split / 3 reduce."""
    pdl_enter(PDL)
    N, K, E, H, I = dims
    count_E, slot_E, used = _expert_counts(ids, N, K, E, NS, BLOCK_E, CHUNK_N)
    tiles = tl.cdiv(I, BLOCK_I)
    n_split = used * tiles
    ticket = tl.atomic_add(ws_ptr, 1, sem="relaxed")
    while ticket < n_split + tl.cdiv(H, BLOCK_R):
        t0 = stamp(TRACE)
        if ticket < n_split:  # no activation scales (never W8A8)
            _up_item(ticket, tiles, count_E, slot_E, x, ids, gate_up, (x[0], 0), h, dims,
                     G[0], G[1], G[2], False, G[3], BLOCK_M, BLOCK_I, BLOCK_H, BLOCK_E, CHUNK_N, NUM_STAGES, NS, ACT)
            tl.debug_barrier()  # the tile's h, stored by every thread, is read back below
            _partial_item(ticket, tiles, count_E, slot_E, h, ids, down, p_ptr, dims,
                          D[0], D[1], D[2], D[3], BLOCK_M, BLOCK_I, BLOCK_HO, BLOCK_E, CHUNK_N, NUM_STAGES, NS)
            tl.debug_barrier()  # every thread's partial sums precede the release
            tl.atomic_add(ws_ptr + 2, 1, sem="release")
        else:
            _wait_for(ws_ptr + 2, n_split)  # handed out before this one: running, they finish
            _reduce_cols(p_ptr, w, ids, y, T, K, E, H, tiles, ticket - n_split, NS, BLOCK_T, BLOCK_R)
        record(trace_ptr, ticket, tl.where(ticket < n_split, 2, 3), t0, TRACE)
        ticket = tl.atomic_add(ws_ptr, 1, sem="relaxed")
    if tl.atomic_add(ws_ptr + 1, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # the last to leave
        tl.store(ws_ptr + tl.arange(0, 4), tl.zeros([4], dtype=tl.int32), mask=tl.arange(0, 4) < 3)
    pdl_exit(PDL)


@runtime.serial_interpreter  # its counters (decode_fused.workspace) are shared by every call on the device
def split_launch(op, weights_TK, ids_TK, E: int, I: int, cfg, trace=None) -> torch.Tensor:  # noqa: E741
    """y_TH by split items (inputs checked, T ≥ 1; ``op``: :func:`dispatch.kernels.gemv._operands`)."""
    x_TH, ns, N = op.x_TH, op.ns, op.N
    (T, H), K = x_TH.shape, ids_TK.shape[1]
    tiles = triton.cdiv(I, cfg.block_i)
    ws = decode_fused.workspace(x_TH.device, 3)
    h_NI = torch.empty(N, I, dtype=x_TH.dtype, device=x_TH.device)
    p = torch.empty(N * tiles * H, dtype=torch.float32, device=x_TH.device)
    y_TH = torch.empty(T, H, dtype=x_TH.dtype, device=x_TH.device)
    items = min(E + ns, N) * tiles + triton.cdiv(H, R_COLS)  # at most: used experts × tiles, then the reduce
    tr, = trace_rows.buffers(trace, x_TH, ("split", items))
    _split_decode_kernel[(max(1, min(cfg.programs, items)),)](
        (x_TH, x_TH.stride(0)), (ids_TK, *ids_TK.stride()), (weights_TK, *weights_TK.stride()), op.gate_up_arg,
        op.down_arg, (h_NI, h_NI.stride(0)), (y_TH, y_TH.stride(0)), (N, K, E, H, I), T, p, ws, tr,
        **weight_consts(op),
        BLOCK_M=cfg.block_m, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_HO=cfg.block_ho, BLOCK_E=op.BLOCK_E,
        CHUNK_N=op.CHUNK_N, NUM_STAGES=cfg.num_stages, NS=ns, BLOCK_T=min(16, triton.next_power_of_2(T)),
        BLOCK_R=R_COLS, ACT=op.ACT, num_warps=cfg.num_warps, TRACE=trace is not None,
        **pdl.launch_kw(x_TH.device, late=True))
    return y_TH
