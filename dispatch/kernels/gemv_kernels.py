"""Triton kernels of the decode path; the launcher and the story are in :mod:`dispatch.kernels.gemv`.

The weights are bf16/fp16/fp32, or 8-bit codes with fp32 scales (``QUANT``, chapter 7): the constexpr
switch of :mod:`dispatch.kernels.quant_kernels`; ``QUANT=False`` compiles to the plain ``tl.dot``.

Grouping by expert happens inside the kernels, with no sort launch and no host sync (a decode step
is three launches). Every program counts the rows per expert in ``ids_TK`` (``_expert_counts``);
the used experts, in id order, are the *slots*. The work is a flat list of (slot, tile) items, slot
by slot; program p does items p, p + G, p + 2G, ... for a grid of G programs, so every program gets
the same number of tiles, give or take one, however many experts the tokens chose. For each item
it finds the slot's expert (``_slot_expert``) and the routed rows n = t·K + k sent to it, ascending
(``_rows_of_expert``).

A shared expert (DeepSeek-MoE's: S = NS·I columns, every token, no gate) rides along as ``NS`` more
experts, ids E .. E+NS-1, chosen by every token with weight 1 in routed columns K .. K+NS-1 that
``ids_TK`` does not hold (``_route_ids`` makes them up). SwiGLU splits exactly over the intermediate
dimension, so expert E+j is rows j·I .. (j+1)·I-1 of the shared gate and of the shared up projection
and columns j·I .. (j+1)·I-1 of the shared down projection, read in place from the shared weights'
own tensors (``sgu_ptr`` [2S, H], ``sdn_ptr`` [H, S]). ``NS = 0`` compiles to the routed experts alone.

Operands travel as tuples, a pointer with its strides (:data:`GROUPS` names their fields); a launch
specialises each field as it would a lone argument (a unit stride becomes the constant 1).
"""
import triton
import triton.language as tl

from dispatch.kernels.helpers import gated
from dispatch.kernels.pdl import pdl_enter, pdl_exit
from dispatch.kernels.quant_kernels import _act_scales, _block_scales, _qdot, _qfma
from dispatch.kernels.trace import record, stamp

# The operands the decode kernels take as tuples, by argument name: each one's fields, in order (strides named
# stride_<operand><dim>; a weight's scales follow its codes, then the shared experts' weights).
GROUPS = {
    "x": ("x_ptr", "stride_xt"),  # x_TH (or its fp8 codes)
    "ids": ("ids_ptr", "stride_it", "stride_ik"),  # ids_TK
    "w": ("w_ptr", "stride_wt", "stride_wk"),  # weights_TK (routing weights)
    "gate_up": ("gu_ptr", "stride_ge", "stride_gi", "gs_ptr", "stride_gse", "stride_gsr", "stride_gsc",
                "sgu_ptr", "stride_sgi"),  # gate_up_E2IH (or codes), its scales, the shared gate/up [2S, H]
    "down": ("dn_ptr", "stride_de", "stride_dh", "ds_ptr", "stride_dse", "stride_dsr", "stride_dsc",
             "sdn_ptr", "stride_sdh"),  # down_EHI (or codes), its scales, the shared down [H, S]
    "h": ("h_ptr", "stride_hn"),  # h_NI
    "out": ("out_ptr", "stride_on"),  # out_NH, fp32
    "xs": ("xs_ptr", "stride_xs"),  # W8A8: x's scales (per token and 128 columns)
    "hs": ("hs_ptr", "stride_hs"),  # W8A8: h's scales (per routed row and 128 columns)
    "y": ("y_ptr", "stride_yt"),  # y_TH
    "dims": ("N", "K", "E", "H", "I"),  # routed rows, experts a token, experts, hidden, intermediate
}


@triton.jit
def _route_ids(ids, offs_n, N, K, E, NS: tl.constexpr):
    """The expert id of each routed row n in ``offs_n`` (-1 past N): ids_TK[n // K, n % K], or with
    NS shared experts, rows of K + NS per token whose last NS are the shared experts E .. E+NS-1
    (an id of ids_TK outside [0, E) then reads as -1: it must not alias a shared expert)."""
    ids_ptr, stride_it, stride_ik = ids
    if NS == 0:
        ids_n = tl.load(ids_ptr + (offs_n // K) * stride_it + (offs_n % K) * stride_ik, mask=offs_n < N, other=-1)
    else:
        k = offs_n % (K + NS)
        ids_n = tl.load(ids_ptr + (offs_n // (K + NS)) * stride_it + k * stride_ik, mask=(offs_n < N) & (k < K),
                        other=-1)
        ids_n = tl.where((ids_n >= 0) & (ids_n < E), ids_n, -1)
        ids_n = tl.where(k < K, ids_n, E + k - K)
        ids_n = tl.where(offs_n < N, ids_n, -1)
    return ids_n


@triton.jit
def _expert_counts(ids, N, K, E, NS: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr):
    """(rows per expert [BLOCK_E], slot of each expert [BLOCK_E], -1 if unused, number of used experts)."""
    offs_e = tl.arange(0, BLOCK_E)
    count_E = tl.zeros([BLOCK_E], dtype=tl.int32)
    for n0 in range(0, N, CHUNK_N):
        ids_n = _route_ids(ids, n0 + tl.arange(0, CHUNK_N), N, K, E, NS)
        count_E += tl.sum((ids_n[None, :] == offs_e[:, None]).to(tl.int32), axis=1)
    used_E = ((count_E > 0) & (offs_e < E + NS)).to(tl.int32)  # ids outside [0, E + NS) never form a slot
    slot_E = tl.where(used_E > 0, tl.cumsum(used_E, axis=0) - 1, -1)
    return count_E, slot_E, tl.sum(used_E, axis=0)


@triton.jit
def _slot_expert(count_E, slot_E, slot, BLOCK_E: tl.constexpr):
    """(expert id, row count) of the slot-th smallest expert present in ids."""
    is_slot = slot_E == slot
    return tl.sum(tl.where(is_slot, tl.arange(0, BLOCK_E), 0)), tl.sum(tl.where(is_slot, count_E, 0))


@triton.jit
def _rows_of_expert(ids, N, K, E, NS: tl.constexpr, e, count, m0, BLOCK_M: tl.constexpr, CHUNK_N: tl.constexpr):
    """Routed rows n (ascending) number m0 .. m0+BLOCK_M-1 of expert e, and which of them exist."""
    offs_m = m0 + tl.arange(0, BLOCK_M)
    rows_M = tl.zeros([BLOCK_M], dtype=tl.int32)
    seen = 0  # rows of e in earlier chunks
    for n0 in range(0, N, CHUNK_N):
        offs_n = n0 + tl.arange(0, CHUNK_N)
        ids_n = _route_ids(ids, offs_n, N, K, E, NS)
        match = (ids_n == e).to(tl.int32)
        rank = seen + tl.cumsum(match, axis=0) - 1
        hit = (match[None, :] > 0) & (rank[None, :] == offs_m[:, None])
        rows_M += tl.sum(tl.where(hit, offs_n[None, :], 0), axis=1)
        seen += tl.sum(match, axis=0)
    return rows_M, offs_m < count


@triton.jit
def _tile_acc(BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """The fp32 accumulator of a [BLOCK_M, BLOCK_N] output tile reduced over BLOCK_K chunks: [BLOCK_M, BLOCK_N]
    for ``tl.dot``, or with one row (``BLOCK_M = 1``, FMAs) the partial sums per K lane, [BLOCK_K, BLOCK_N]."""
    if BLOCK_M == 1:
        acc = tl.zeros([BLOCK_K, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    return acc


@triton.jit
def _tile_mac(a, s_M, q, s_N, acc, BLOCK_M: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
              LATE_SCALE: tl.constexpr):
    """acc + a @ w for one reduction chunk: ``_qdot`` (tensor cores; W8A8: fp8 codes a with scales
    s_M, both scales on each chunk's product), or ``_qfma`` with one row (never W8A8: 16-row tiles)."""
    if BLOCK_M == 1:  # CUDA-core FMAs, no tensor-core padding of one row to 16
        acc = _qfma(a, q, s_N, acc, QUANT, LATE_SCALE)
    elif W8A8:  # activations scaled per 128 columns: never late (a per-row weight scale is s_N each chunk)
        acc = _qdot(a, s_M, q, s_N, acc, QUANT, W8A8, False, False)
    else:
        acc = _qdot(a, s_M, q, s_N, acc, QUANT, W8A8, LATE_SCALE, False)
    return acc


@triton.jit
def _late_scales(acc, s_ptr, cols, mask_c, stride_sr, stride_sc, SBR: tl.constexpr, SBC: tl.constexpr,
                 QUANT: tl.constexpr, W8A8: tl.constexpr, LATE_SCALE: tl.constexpr):
    """LATE_SCALE (one scale a weight row): applied once, after the loop (W8A8: on every chunk instead)."""
    if LATE_SCALE and not W8A8:
        acc *= _block_scales(s_ptr, cols, 0, mask_c, stride_sr, stride_sc, SBR, SBC, QUANT)[None, :]
    return acc


@triton.jit
def _tile_out(acc, BLOCK_M: tl.constexpr):
    """The accumulator as [BLOCK_M, BLOCK_N]: one row's partial sums summed once, after the loop."""
    if BLOCK_M == 1:
        acc = tl.sum(acc, axis=0)[None, :]
    return acc


@triton.jit
def _up_item(item, tiles, count_E, slot_E,  # the item; the expert counts and slots (_expert_counts)
             x, ids, gate_up, xs, h, dims,  # operands (GROUPS); dims: (N, K, E, H, I)
             SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
             LATE_SCALE: tl.constexpr,  # gate/up's format (quant_kernels), W8A8: x holds fp8 codes
             BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr,
             CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NS: tl.constexpr, ACT: tl.constexpr):  # tiles, NS, act
    """Up item (slot, I tile) = divmod(item, tiles): h_NI[rows of the slot's expert, the I tile] =
    act(x @ gate.T) * (x @ up.T) (``ACT``: :mod:`dispatch.activations`); its gate/up rows streamed once.
    W8A8: x holds fp8 codes, xs their scales (per token and 128 columns). Returns the slot."""
    x_ptr, stride_xt = x
    gu_ptr, stride_ge, stride_gi, gs_ptr, stride_gse, stride_gsr, stride_gsc, sgu_ptr, stride_sgi = gate_up
    xs_ptr, stride_xs = xs
    h_ptr, stride_hn = h
    N, K, E, H, I = dims
    slot = item // tiles
    e, count = _slot_expert(count_E, slot_E, slot, BLOCK_E)
    s_e = gs_ptr + e.to(tl.int64) * stride_gse  # this expert's scales (QUANT only)
    offs_i = (item % tiles) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask_i = offs_i < I
    base = gu_ptr + e.to(tl.int64) * stride_ge  # the expert's gate rows; its up rows s_up further on
    s_row, s_up = stride_gi, I * stride_gi
    if NS > 0:  # shared expert E + j: rows j·I.. of the shared gate, S + j·I.. of its up (S = NS·I)
        shared = e >= E
        base = tl.where(shared, sgu_ptr + ((e - E) * I).to(tl.int64) * stride_sgi, base)
        s_row = tl.where(shared, stride_sgi, s_row)
        s_up = tl.where(shared, NS * I * stride_sgi, s_up)
    gate_ptr = base + offs_i[None, :] * s_row  # [1, BLOCK_I], H contiguous
    up_ptr = gate_ptr + s_up
    for m0 in range(0, count, BLOCK_M):  # BLOCK_M of the expert's rows at a time (one, mostly)
        rows_M, valid_M = _rows_of_expert(ids, N, K, E, NS, e, count, m0, BLOCK_M, CHUNK_N)
        tok_M = rows_M // (K + NS)
        x_row = x_ptr + tok_M.to(tl.int64)[:, None] * stride_xt
        acc_g = _tile_acc(BLOCK_M, BLOCK_H, BLOCK_I)
        acc_u = _tile_acc(BLOCK_M, BLOCK_H, BLOCK_I)
        for h0 in tl.range(0, H, BLOCK_H, num_stages=NUM_STAGES):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            mask_h = offs_h < H
            x_MH = tl.load(x_row + offs_h[None, :], mask=valid_M[:, None] & mask_h[None, :], other=0.0)
            w_mask = mask_h[:, None] & mask_i[None, :]
            g_HI = tl.load(gate_ptr + offs_h[:, None], mask=w_mask, other=0.0)  # [BLOCK_H, BLOCK_I]
            u_HI = tl.load(up_ptr + offs_h[:, None], mask=w_mask, other=0.0)
            sg_I = _block_scales(s_e, offs_i, h0, mask_i, stride_gsr, stride_gsc, SBR, SBC, QUANT)
            su_I = _block_scales(s_e, I + offs_i, h0, mask_i, stride_gsr, stride_gsc, SBR, SBC, QUANT)
            sx_M = _act_scales(xs_ptr, tok_M, h0, valid_M, stride_xs, W8A8)
            acc_g = _tile_mac(x_MH, sx_M, g_HI, sg_I, acc_g, BLOCK_M, QUANT, W8A8, LATE_SCALE)
            acc_u = _tile_mac(x_MH, sx_M, u_HI, su_I, acc_u, BLOCK_M, QUANT, W8A8, LATE_SCALE)
        acc_g = _late_scales(_tile_out(acc_g, BLOCK_M), s_e, offs_i, mask_i, stride_gsr, stride_gsc, SBR, SBC, QUANT,
                             W8A8, LATE_SCALE)  # before the SwiGLU
        acc_u = _late_scales(_tile_out(acc_u, BLOCK_M), s_e, I + offs_i, mask_i, stride_gsr, stride_gsc, SBR, SBC,
                             QUANT, W8A8, LATE_SCALE)
        h_MI = gated(acc_g, acc_u, ACT)
        h_out = h_ptr + rows_M.to(tl.int64)[:, None] * stride_hn + offs_i[None, :]
        tl.store(h_out, h_MI.to(h_ptr.dtype.element_ty), mask=valid_M[:, None] & mask_i[None, :])
    return slot


@triton.jit
def _down_item(item, tiles, count_E, slot_E,  # the item; the expert counts and slots (_expert_counts)
               h, ids, w, down, out, hs, dims,  # operands (GROUPS); dims: (N, K, E, H, I)
               SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
               LATE_SCALE: tl.constexpr,  # down's format (quant_kernels), W8A8: h holds fp8 codes
               BLOCK_M: tl.constexpr, BLOCK_HO: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_E: tl.constexpr,
               CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr, NS: tl.constexpr):  # tiles, shared experts
    """Down item (slot, H tile) = divmod(item, tiles): out_NH[rows of the slot's expert, the H tile] =
    weight · (h @ down.T), fp32, all of I; its down rows streamed once. h is read from L2 (``.cg``):
    in the one-launch path (:mod:`dispatch.kernels.decode_fused`) other programs of this kernel wrote it.
    W8A8: h holds fp8 codes, hs their scales (per routed row and 128 columns)."""
    h_ptr, stride_hn = h
    w_ptr, stride_wt, stride_wk = w
    dn_ptr, stride_de, stride_dh, ds_ptr, stride_dse, stride_dsr, stride_dsc, sdn_ptr, stride_sdh = down
    out_ptr, stride_on = out
    hs_ptr, stride_hs = hs
    N, K, E, H, I = dims
    e, count = _slot_expert(count_E, slot_E, item // tiles, BLOCK_E)
    s_e = ds_ptr + e.to(tl.int64) * stride_dse
    offs_o = (item % tiles) * BLOCK_HO + tl.arange(0, BLOCK_HO)
    mask_o = offs_o < H
    base, s_row = dn_ptr + e.to(tl.int64) * stride_de, stride_dh  # the expert's [H, I], its row stride
    if NS > 0:  # shared expert E + j: columns j·I .. of the shared down [H, S]
        base = tl.where(e >= E, sdn_ptr + ((e - E) * I).to(tl.int64), base)
        s_row = tl.where(e >= E, stride_sdh, s_row)
    down_ptr = base + offs_o[None, :] * s_row  # [1, BLOCK_HO], I contiguous
    for m0 in range(0, count, BLOCK_M):
        rows_M, valid_M = _rows_of_expert(ids, N, K, E, NS, e, count, m0, BLOCK_M, CHUNK_N)
        h_row = h_ptr + rows_M.to(tl.int64)[:, None] * stride_hn
        k_M = rows_M % (K + NS)  # the shared experts' columns (k >= K) have weight 1
        w_M = tl.load(w_ptr + (rows_M // (K + NS)) * stride_wt + k_M * stride_wk, mask=valid_M & (k_M < K),
                      other=1.0)
        acc = _tile_acc(BLOCK_M, BLOCK_I, BLOCK_HO)
        for i0 in tl.range(0, I, BLOCK_I, num_stages=NUM_STAGES):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            mask_i = offs_i < I
            h_MI = tl.load(h_row + offs_i[None, :], mask=valid_M[:, None] & mask_i[None, :], other=0.0,
                           cache_modifier=".cg")
            d_IO = tl.load(down_ptr + offs_i[:, None], mask=mask_i[:, None] & mask_o[None, :], other=0.0)
            s_O = _block_scales(s_e, offs_o, i0, mask_o, stride_dsr, stride_dsc, SBR, SBC, QUANT)
            sh_M = _act_scales(hs_ptr, rows_M, i0, valid_M, stride_hs, W8A8)
            acc = _tile_mac(h_MI, sh_M, d_IO, s_O, acc, BLOCK_M, QUANT, W8A8, LATE_SCALE)
        acc = _late_scales(_tile_out(acc, BLOCK_M), s_e, offs_o, mask_o, stride_dsr, stride_dsc, SBR, SBC, QUANT, W8A8,
                           LATE_SCALE)
        out_row = out_ptr + rows_M.to(tl.int64)[:, None] * stride_on + offs_o[None, :]
        tl.store(out_row, acc * w_M.to(tl.float32)[:, None], mask=valid_M[:, None] & mask_o[None, :])


@triton.jit
def _up_swiglu_kernel(x, ids, gate_up, xs, h, dims, trace_ptr,  # operands (GROUPS), the trace rows
                      SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
                      LATE_SCALE: tl.constexpr,  # gate/up's format, W8A8: x holds fp8 codes
                      BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr,  # tiles
                      PDL: tl.constexpr, NS: tl.constexpr, ACT: tl.constexpr, TRACE: tl.constexpr = False):
    """Every up item; grid (G,): items (slot, I tile), slot-major; program p does items p, p + G, ...
    TRACE: each item's SM, program and times in row ``item`` of trace_ptr (:mod:`dispatch.kernels.trace`)."""
    pdl_enter(PDL)  # the expert ids come from the kernel before: nothing to read ahead of them
    N, K, E, H, I = dims
    count_E, slot_E, used = _expert_counts(ids, N, K, E, NS, BLOCK_E, CHUNK_N)
    tiles = tl.cdiv(I, BLOCK_I)
    for item in range(tl.program_id(0), used * tiles, tl.num_programs(0)):
        t0 = stamp(TRACE)
        _up_item(item, tiles, count_E, slot_E, x, ids, gate_up, xs, h, dims, SBR, SBC, QUANT, W8A8, LATE_SCALE,
                 BLOCK_M, BLOCK_I, BLOCK_H, BLOCK_E, CHUNK_N, NUM_STAGES, NS, ACT)
        record(trace_ptr, item, 0, t0, TRACE)
    pdl_exit(PDL)


@triton.jit
def _down_kernel(h, ids, w, down, out, hs, dims, trace_ptr,  # operands (GROUPS), the trace rows
                 SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
                 LATE_SCALE: tl.constexpr,  # down's format, W8A8: h holds fp8 codes
                 BLOCK_M: tl.constexpr, BLOCK_HO: tl.constexpr, BLOCK_I: tl.constexpr,
                 BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr,  # tiles
                 PDL: tl.constexpr, NS: tl.constexpr, TRACE: tl.constexpr = False):
    """Every down item; grid (G,): items (slot, H tile), slot-major; program p does items p, p + G, ...
    TRACE: as the up kernel's."""
    pdl_enter(PDL)
    N, K, E, H, I = dims
    count_E, slot_E, used = _expert_counts(ids, N, K, E, NS, BLOCK_E, CHUNK_N)
    tiles = tl.cdiv(H, BLOCK_HO)
    for item in range(tl.program_id(0), used * tiles, tl.num_programs(0)):
        t0 = stamp(TRACE)
        _down_item(item, tiles, count_E, slot_E, h, ids, w, down, out, hs, dims, SBR, SBC, QUANT, W8A8, LATE_SCALE,
                   BLOCK_M, BLOCK_HO, BLOCK_I, BLOCK_E, CHUNK_N, NUM_STAGES, NS)
        record(trace_ptr, item, 1, t0, TRACE)
    pdl_exit(PDL)
