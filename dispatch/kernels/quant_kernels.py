"""The weight operand of the expert kernels: bf16/fp16/fp32 weights, or 8-bit codes + fp32 scales.

One constexpr switch, ``QUANT``, picks the weight format inside the decode kernels
(:mod:`dispatch.kernels.gemv_kernels`) and the grouped GEMM tiles (:mod:`dispatch.kernels.grouped_kernels`).
``QUANT=False`` compiles to the plain ``tl.dot`` of the unquantized kernels (no scale is loaded).
``QUANT=True`` streams a [BLOCK_K, BLOCK_N] tile of codes (int8 or fp8 e4m3): half the bytes of
bf16, dequantized in registers, never in memory:

    w8a16  acc += (a @ codes) · scale_N        codes converted to a's dtype (exact: |int8| ≤ 127,
                                               e4m3 has 3 mantissa bits), bf16/fp16 tensor cores
    w8a8   acc += (fp8(a / s_a) @ codes) · s_a · scale_N      fp8 tensor cores (sm_89+); s_a =
                                               amax(row of the a chunk) / 448, per token and chunk

A reduction chunk (BLOCK_K) never straddles two scale blocks (the launchers check it), so one scale
per output column covers the whole chunk. Where one scale covers a whole row (per-channel schemes,
weight-only), it is applied once after the reduction (``LATE_SCALE``): the plain ``tl.dot``
accumulation, one multiply per output.
"""
import torch
import triton
import triton.language as tl

_FP8_MAX = tl.constexpr(448.0)  # the largest finite e4m3 value (dispatch.quant.formats.FP8_MAX)


@triton.jit
def _block_scales(s_ptr, rows, k0, mask, s_sr, s_sc, SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr):
    """Scale of each weight row in ``rows`` for the reduction chunk starting at k0 (1.0 if not QUANT)."""
    s = 1.0
    if QUANT:
        s = tl.load(s_ptr + (rows // SBR) * s_sr + (k0 // SBC) * s_sc, mask=mask, other=1.0)
    return s


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
def _qdot(a, q, s_N, acc, QUANT: tl.constexpr, W8A8: tl.constexpr, LATE_SCALE: tl.constexpr,
          PRE_ROUND: tl.constexpr):
    """acc + a [M, K] @ w [K, N]: w itself (not QUANT), or codes q · s_N dequantized in registers."""
    if QUANT:
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
    else:
        acc = tl.dot(a, q, acc)  # unquantized weights: exactly the plain kernel's dot
    return acc  # one return (Triton 3.6 compiles constexpr branches with a single exit)


def weight_operand(w, k_cols: int, w8a8: bool = False):
    """What a kernel is given for its weight ``w`` (a tensor, or a ``dispatch.quant.QuantizedTensor``)
    reduced over ``k_cols`` columns: (weights or codes, scale tensor, its 3 strides, constexprs).

    A plain tensor gets ``QUANT=False`` and itself as a never-read scale pointer."""
    if w8a8 and getattr(getattr(w, "q", w), "dtype", None) != torch.float8_e4m3fn:
        raise ValueError("w8a8 multiplies fp8 by fp8: the weights must be fp8 e4m3 codes (a QuantizedTensor)")
    if isinstance(w, torch.Tensor):
        w = w if w.stride(-1) == 1 else w.contiguous()  # the kernels read along a contiguous last dim
        return w, w, (0, 0, 0), dict(SBR=1, SBC=1, QUANT=False, LATE_SCALE=False)
    q = w.q if w.q.stride(-1) == 1 else w.q.contiguous()
    return q, w.scale, tuple(w.scale.stride()), dict(
        SBR=w.block_rows, SBC=w.block_cols, QUANT=True, LATE_SCALE=not w8a8 and w.block_cols >= k_cols)
