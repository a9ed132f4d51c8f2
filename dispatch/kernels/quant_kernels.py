"""Triton pieces that read quantized expert weights (8-bit codes + fp32 block scales).

The weight tile a kernel streams is a [BLOCK_K, BLOCK_N] tile of codes (int8 or fp8 e4m3): half the
bytes of bf16. It is dequantized in registers, never in memory:

    w8a16  acc += (a @ codes) · scale_N        codes converted to a's dtype (exact: |int8| ≤ 127,
                                               e4m3 has 3 mantissa bits), bf16/fp16 tensor cores
    w8a8   acc += (fp8(a / s_a) @ codes) · s_a · scale_N      fp8 tensor cores (sm_89+); s_a =
                                               amax(row of the a chunk) / 448, per token and chunk

A reduction chunk (BLOCK_K) never straddles two scale blocks (the launchers check it), so one scale
per output column covers the whole chunk. Where one scale covers a whole row (per-channel schemes,
weight-only), it is applied once after the reduction (``LATE_SCALE``): the plain ``tl.dot``
accumulation, one multiply per output.

Decode kernels (grouping inside the kernel, as ``dispatch.kernels.gemv_kernels``): only the weight
loads differ from the unquantized kernels, whose grouping helpers they reuse.
"""
import triton
import triton.language as tl

from dispatch.kernels.gemv_kernels import _rows_of_expert, _slot_expert
from dispatch.quant.formats import FP8_MAX

_FP8_MAX = tl.constexpr(FP8_MAX)  # the largest finite e4m3 value


@triton.jit
def _block_scales(s_ptr, rows, k0, mask, s_sr, s_sc, SBR: tl.constexpr, SBC: tl.constexpr):
    """Scale of each weight row in ``rows`` for the reduction chunk starting at k0 ([len(rows)])."""
    return tl.load(s_ptr + (rows // SBR) * s_sr + (k0 // SBC) * s_sc, mask=mask, other=1.0)


@triton.jit
def _e4m3_round(v):
    """fp32 v (|v| <= 448) rounded to the nearest e4m3 value (ties to even) in fp32 arithmetic.

    Only under the interpreter, whose fp32 → e4m3 conversion drops the carry when rounding crosses
    a power of two (127.4 → 64); after this rounding the conversion is exact. GPUs convert in hardware.
    """
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # keep 3 mantissa bits, round to even
    magic = 12582912.0  # 1.5 · 2^23: adding and subtracting it rounds to an integer, ties to even
    subnormal = ((v * 512.0 + magic) - magic) / 512.0  # below 2^-6, e4m3 steps by 2^-9
    return tl.where(tl.abs(v) < 0.015625, subnormal, bits.to(tl.float32, bitcast=True))


@triton.jit
def _qdot(a, q, s_N, acc, W8A8: tl.constexpr, LATE_SCALE: tl.constexpr, PRE_ROUND: tl.constexpr):
    """acc + a [M, K] @ (q [K, N] codes · s_N): one reduction chunk, dequantized in registers."""
    if W8A8:
        af = a.to(tl.float32)
        s_M = tl.maximum(tl.max(tl.abs(af), axis=1), 1e-30) / _FP8_MAX  # per token, this K chunk
        af = tl.clamp(af / s_M[:, None], -_FP8_MAX, _FP8_MAX)
        if PRE_ROUND:
            af = _e4m3_round(af)
        acc = acc + tl.dot(af.to(tl.float8e4nv), q) * (s_M[:, None] * s_N[None, :])
    elif LATE_SCALE:
        acc = tl.dot(a, q.to(a.dtype), acc)  # the row's one scale is applied after the reduction
    else:
        acc = acc + tl.dot(a, q.to(a.dtype)) * s_N[None, :]
    return acc  # one return (Triton 3.6 compiles constexpr branches with a single exit)


@triton.jit
def _up_swiglu_q_kernel(x_ptr, ids_ptr, gu_ptr, gs_ptr, h_ptr, N, K, E, H, I,
                        s_xt, s_it, s_ik, s_ge, s_gi, s_se, s_sr, s_sc, s_hn,
                        SBR: tl.constexpr, SBC: tl.constexpr, LATE_SCALE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Decode up + SwiGLU with quantized gate/up codes (``gemv_kernels._up_swiglu_kernel`` + scales)."""
    slot = tl.program_id(0)
    e, count = _slot_expert(ids_ptr, s_it, s_ik, N, K, E, slot, BLOCK_E, CHUNK_N)
    s_e = gs_ptr + e.to(tl.int64) * s_se
    for m0 in range(0, count, BLOCK_M):
        rows_M, valid_M = _rows_of_expert(ids_ptr, s_it, s_ik, N, K, e, count, m0, BLOCK_M, CHUNK_N)
        x_row = x_ptr + (rows_M // K).to(tl.int64)[:, None] * s_xt
        for tile in range(tl.program_id(1), tl.cdiv(I, BLOCK_I), tl.num_programs(1)):
            offs_i = tile * BLOCK_I + tl.arange(0, BLOCK_I)
            mask_i = offs_i < I
            gate_ptr = gu_ptr + e.to(tl.int64) * s_ge + offs_i[None, :] * s_gi
            up_ptr = gate_ptr + I * s_gi
            acc_g = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
            acc_u = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
            for h0 in tl.range(0, H, BLOCK_H, num_stages=NUM_STAGES):
                offs_h = h0 + tl.arange(0, BLOCK_H)
                mask_h = offs_h < H
                x_MH = tl.load(x_row + offs_h[None, :], mask=valid_M[:, None] & mask_h[None, :], other=0.0)
                w_mask = mask_h[:, None] & mask_i[None, :]
                g_HI = tl.load(gate_ptr + offs_h[:, None], mask=w_mask, other=0.0)  # codes
                u_HI = tl.load(up_ptr + offs_h[:, None], mask=w_mask, other=0.0)
                sg_I = _block_scales(s_e, offs_i, h0, mask_i, s_sr, s_sc, SBR, SBC)
                su_I = _block_scales(s_e, I + offs_i, h0, mask_i, s_sr, s_sc, SBR, SBC)
                acc_g = _qdot(x_MH, g_HI, sg_I, acc_g, False, LATE_SCALE, False)
                acc_u = _qdot(x_MH, u_HI, su_I, acc_u, False, LATE_SCALE, False)
            if LATE_SCALE:
                acc_g *= _block_scales(s_e, offs_i, 0, mask_i, s_sr, s_sc, SBR, SBC)[None, :]
                acc_u *= _block_scales(s_e, I + offs_i, 0, mask_i, s_sr, s_sc, SBR, SBC)[None, :]
            h_MI = acc_g * tl.sigmoid(acc_g) * acc_u
            h_out = h_ptr + rows_M.to(tl.int64)[:, None] * s_hn + offs_i[None, :]
            tl.store(h_out, h_MI.to(h_ptr.dtype.element_ty), mask=valid_M[:, None] & mask_i[None, :])


@triton.jit
def _down_q_kernel(h_ptr, ids_ptr, w_ptr, dn_ptr, ds_ptr, out_ptr, N, K, E, H, I,
                   s_it, s_ik, s_wt, s_wk, s_de, s_dh, s_se, s_sr, s_sc, s_hn, s_on,
                   SBR: tl.constexpr, SBC: tl.constexpr, LATE_SCALE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_HO: tl.constexpr, BLOCK_I: tl.constexpr,
                   BLOCK_E: tl.constexpr, CHUNK_N: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Decode down × routing weight with quantized down codes (``gemv_kernels._down_kernel`` + scales)."""
    slot = tl.program_id(0)
    e, count = _slot_expert(ids_ptr, s_it, s_ik, N, K, E, slot, BLOCK_E, CHUNK_N)
    s_e = ds_ptr + e.to(tl.int64) * s_se
    for m0 in range(0, count, BLOCK_M):
        rows_M, valid_M = _rows_of_expert(ids_ptr, s_it, s_ik, N, K, e, count, m0, BLOCK_M, CHUNK_N)
        h_row = h_ptr + rows_M.to(tl.int64)[:, None] * s_hn
        w_M = tl.load(w_ptr + (rows_M // K) * s_wt + (rows_M % K) * s_wk, mask=valid_M, other=0.0).to(tl.float32)
        for tile in range(tl.program_id(1), tl.cdiv(H, BLOCK_HO), tl.num_programs(1)):
            offs_o = tile * BLOCK_HO + tl.arange(0, BLOCK_HO)
            mask_o = offs_o < H
            down_ptr = dn_ptr + e.to(tl.int64) * s_de + offs_o[None, :] * s_dh
            acc = tl.zeros([BLOCK_M, BLOCK_HO], dtype=tl.float32)
            for i0 in tl.range(0, I, BLOCK_I, num_stages=NUM_STAGES):
                offs_i = i0 + tl.arange(0, BLOCK_I)
                mask_i = offs_i < I
                h_MI = tl.load(h_row + offs_i[None, :], mask=valid_M[:, None] & mask_i[None, :], other=0.0)
                d_IO = tl.load(down_ptr + offs_i[:, None], mask=mask_i[:, None] & mask_o[None, :], other=0.0)
                s_O = _block_scales(s_e, offs_o, i0, mask_o, s_sr, s_sc, SBR, SBC)
                acc = _qdot(h_MI, d_IO, s_O, acc, False, LATE_SCALE, False)
            if LATE_SCALE:
                acc *= _block_scales(s_e, offs_o, 0, mask_o, s_sr, s_sc, SBR, SBC)[None, :]
            out = out_ptr + rows_M.to(tl.int64)[:, None] * s_on + offs_o[None, :]
            tl.store(out, acc * w_M[:, None], mask=valid_M[:, None] & mask_o[None, :])
