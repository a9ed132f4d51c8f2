"""The weight operand of the expert kernels: bf16/fp16/fp32 weights, or 8-bit codes + fp32 scales.

One constexpr switch, ``QUANT``, picks the weight format inside the decode kernels
(:mod:`dispatch.kernels.gemv_kernels`) and the grouped GEMM tiles (:mod:`dispatch.kernels.grouped_kernels`).
``QUANT=False`` compiles to the plain ``tl.dot`` of the unquantized kernels (no scale is loaded).
``QUANT=True`` streams a [BLOCK_K, BLOCK_N] tile of codes (int8 or fp8 e4m3): half the bytes of
bf16, dequantized in registers, never in memory:

    w8a16  acc += (a @ codes) · scale_N        codes converted to a's dtype (exact: |int8| ≤ 127,
                                               e4m3 has 3 mantissa bits), bf16/fp16 tensor cores
    w8a8   acc += (a8 @ codes) · s_M · scale_N    a8, s_M: the activations quantized once before the
                                               GEMM (``fp8_rows``: fp8 codes, one scale per token and
                                               128 columns); fp8 MMAs (sm_89+; on sm_90
                                               only the grouped GEMM's 64-row warpgroup MMAs:
                                               16-row decode tiles run as fp16 MMAs there)

A reduction chunk (BLOCK_K) never straddles two scale blocks (the launchers check it), so one scale
per output column covers the whole chunk. Where one scale covers a whole row (per-channel schemes,
weight-only), it is applied once after the reduction (``LATE_SCALE``): the plain ``tl.dot``
accumulation, one multiply per output.
"""
import os

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.kernels import tiles
from dispatch.schemes import FP8_MAX, W8A8_GROUP, kernel_constexprs  # noqa: F401  (W8A8_GROUP re-exported)

_FP8_MAX = tl.constexpr(FP8_MAX)  # the largest finite e4m3 value
# fp8 e4m3 → bf16 by bit placement (_e4m3_bf16) where compiled (the interpreter runs no inline PTX);
# DISPATCH_FP8_CVT=hw keeps the hardware's e4m3 → f16 → bf16 conversion (benchmarks compare the two)
_CVT = os.environ.get("DISPATCH_FP8_CVT", "bits")
if _CVT not in ("bits", "hw"):
    raise ValueError(f"DISPATCH_FP8_CVT must be 'bits' (the default) or 'hw', got {_CVT!r}")
BITS_CVT = not runtime.INTERPRET and _CVT == "bits"
_BITS_CVT = tl.constexpr(BITS_CVT)


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
def _e4m3_bf16(q):
    """fp8 e4m3 codes → bf16, exactly, four per 32-bit register, on the integer and FMA pipes.

    The hardware path converts e4m3 pairs to fp16 (one packed ``cvt``), then each fp16 to bf16 on its
    own (a scalar ``F2F`` per code, on a slow unit): chapter 7 races the two conversions
    (``results/h200/quant_fp8_convert.json``).
    Here the code's byte is placed in the high byte of a 16-bit half (``prmt``); its sign is already
    bf16's, its 4 exponent and 3 mantissa bits move right by 4 into bf16's low exponent and high
    mantissa bits, so the half reads as the code's value × 2^-120 (subnormal codes too: they become
    bf16 subnormals); one ``fma.rn.bf16x2`` by 2^120 restores it. The NaN codes 0x7F/0xFF would read
    as ±480; the quantizer never writes them. Needs sm_89+ (as do all fp8 codes here)."""
    return tl.inline_asm_elementwise(
        """
        {
        .reg .b32 lo, hi, t, two120, nz;
        mov.b32 two120, 0x7B807B80;
        mov.b32 nz, 0x80008000;
        prmt.b32 lo, $2, 0, 0x1404;
        prmt.b32 hi, $2, 0, 0x3424;
        shr.b32 t, lo, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 lo, lo, 0x80008000;
        or.b32 lo, lo, t;
        fma.rn.bf16x2 $0, lo, two120, nz;
        shr.b32 t, hi, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 hi, hi, 0x80008000;
        or.b32 hi, hi, t;
        fma.rn.bf16x2 $1, hi, two120, nz;
        }
        """,
        "=r,=r,r", [q.to(tl.uint8, bitcast=True)], dtype=tl.bfloat16, is_pure=True, pack=4)


@triton.jit
def _codes_as(q, dtype: tl.constexpr):
    """8-bit codes in a matmul dtype, exactly: :func:`_e4m3_bf16` for fp8 → bf16 where compiled."""
    if _BITS_CVT and q.dtype == tl.float8e4nv and dtype == tl.bfloat16:
        w = _e4m3_bf16(q)
    else:
        w = q.to(dtype)
    return w


@triton.jit
def _act_scales(as_ptr, rows, k0, mask, s_as, W8A8: tl.constexpr):
    """w8a8: the activation scale of each row in ``rows`` for the 128-column chunk at k0 (else 1s)."""
    if W8A8:
        s = tl.load(as_ptr + rows * s_as + k0 // 128, mask=mask, other=1.0)
    else:
        s = tl.full(rows.shape, 1.0, tl.float32)
    return s


@triton.jit
def _qacc(BM: tl.constexpr, BN: tl.constexpr, WFIRST: tl.constexpr):
    """The fp32 accumulator of a [BM, BN] tile: stored transposed, [BN, BM], in weight-first form."""
    if WFIRST:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    return acc


@triton.jit
def _qout(acc, WFIRST: tl.constexpr):
    """The accumulator as [BM, BN], whichever form it was kept in."""
    if WFIRST:
        acc = tl.trans(acc)
    return acc


@triton.jit
def _qdot(a, s_M, q, s_N, acc, QUANT: tl.constexpr, W8A8: tl.constexpr,
          LATE_SCALE: tl.constexpr, WFIRST: tl.constexpr):
    """acc + a [M, K] @ w [K, N]: w itself (not QUANT), or codes q · s_N.

    W8A8: a holds fp8 codes, s_M their scales. WFIRST: acc is [N, M]."""
    if QUANT:
        if W8A8:
            if LATE_SCALE:
                acc = tl.dot(a, q, acc)  # fp8 × fp8; scales after the loop
            else:
                acc = acc + tl.dot(a, q) * (s_M[:, None] * s_N[None, :])
        elif WFIRST:
            w = (q.to(tl.float32) * s_N[None, :]).to(a.dtype)  # scaled operand
            acc = tl.dot(tl.trans(w), tl.trans(a), acc)  # acc.T += w.T @ a.T
        elif LATE_SCALE:
            acc = tl.dot(a, _codes_as(q, a.dtype), acc)  # its scale: after the loop
        else:
            acc = acc + tl.dot(a, _codes_as(q, a.dtype)) * s_N[None, :]
    else:
        acc = tl.dot(a, q, acc)  # unquantized: the plain kernel's dot
    return acc  # one exit (as Triton 3.6 compiles constexpr branches)


@triton.jit
def _qfma(a_1K, q_KN, s_N, acc_KN, QUANT: tl.constexpr, LATE_SCALE: tl.constexpr):
    """acc + a (one row, [1, K]) times w [K, N], elementwise on the CUDA cores: w itself or codes q · s_N
    (LATE_SCALE: the scale after the reduction). The sum over K is left to the caller (``tl.sum``
    over axis 0 once, after the loop): the decode kernels' one-row tiles, ``BLOCK_M = 1``."""
    w = q_KN.to(tl.float32)
    if QUANT and not LATE_SCALE:
        w = w * s_N[None, :]
    return acc_KN + w * tl.trans(a_1K.to(tl.float32))


@triton.jit
def _fp8_rows_kernel(a_ptr, q_ptr, s_ptr, used_ptr, M, K, GROUP, s_am, s_qm, s_sm,
                     BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                     USED: tl.constexpr, PRE_ROUND: tl.constexpr):
    """Rows of a, column group program_id(1): s = amax / 448, codes fp8(a / s)
    (an IEEE division, div_rn: bitwise the twin's). USED: only the first
    used_ptr[0] · USED rows (the blocks the sort used)."""
    if USED > 0:
        M = tl.minimum(M, tl.load(used_ptr) * USED)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < M
    a_rows = a_ptr + offs_m.to(tl.int64)[:, None] * s_am
    q_rows = q_ptr + offs_m.to(tl.int64)[:, None] * s_qm
    k_lo = tl.program_id(1) * GROUP
    k_hi = tl.minimum(k_lo + GROUP, K)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):  # pass 1: the group's amax
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = mask_m[:, None] & (offs_k < k_hi)[None, :]
        a = tl.load(a_rows + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(a), axis=1))
    s = tl.maximum(amax, 1e-30) / _FP8_MAX
    for k0 in range(k_lo, k_hi, BLOCK_K):  # pass 2: the codes
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = mask_m[:, None] & (offs_k < k_hi)[None, :]
        a = tl.load(a_rows + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.clamp(tl.math.div_rn(a, s[:, None]), -_FP8_MAX, _FP8_MAX)
        if PRE_ROUND:
            v = _e4m3_round(v)
        tl.store(q_rows + offs_k[None, :], v.to(tl.float8e4nv), mask=mask)
    tl.store(s_ptr + offs_m * s_sm + tl.program_id(1), s, mask=mask_m)


def fp8_rows(a_MK: torch.Tensor, group: int | None = 128, *, used_blocks_1: torch.Tensor | None = None,
             block_rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Activations → fp8 e4m3 codes [M, K] and fp32 scales [M, ceil(K / group)], one per row and
    ``group`` columns (None: one per row): what the w8a8 kernels read.
    ``used_blocks_1`` (an int32 [1] on a's device, e.g. a sort's ``num_blocks_1``): only its value ×
    ``block_rows`` leading rows are read and written, no host sync; the rest stay unset.
    Twin: :func:`dispatch.quant.formats.quantize_fp8_rows`."""
    if not isinstance(a_MK, torch.Tensor) or a_MK.dim() != 2 or not a_MK.is_floating_point():
        raise ValueError(f"a must be a floating [M, K] tensor, got {getattr(a_MK, 'dtype', type(a_MK).__name__)} "
                         f"{tuple(getattr(a_MK, 'shape', ()))}")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int)
                              or group not in (32, 64) and (group < 128 or group % 128)):
        raise ValueError(f"group must be 32, 64, a multiple of 128 columns or None (the whole row), got {group!r}")
    if used_blocks_1 is not None and (not isinstance(used_blocks_1, torch.Tensor) or used_blocks_1.numel() != 1
                                      or used_blocks_1.dtype != torch.int32 or used_blocks_1.device != a_MK.device
                                      or not isinstance(block_rows, int) or block_rows < 1):
        raise ValueError("used_blocks_1 must be a one-element int32 tensor on a's device and block_rows a "
                         f"positive int, got {used_blocks_1!r} and {block_rows!r}")
    a_MK = a_MK if a_MK.stride(-1) == 1 else a_MK.contiguous()
    M, K = a_MK.shape
    group = group or max(K, 1)
    q = torch.empty(M, K, device=a_MK.device, dtype=torch.float8_e4m3fn)
    s = torch.empty(M, triton.cdiv(K, group), device=a_MK.device, dtype=torch.float32)
    if M and K:
        bm = 16
        used = used_blocks_1 if used_blocks_1 is not None else s  # never read without it
        _fp8_rows_kernel[(triton.cdiv(M, bm), s.shape[1])](
            a_MK, q, s, used, M, K, group, a_MK.stride(0), q.stride(0), s.stride(0), BLOCK_M=bm,
            BLOCK_K=min(group, 128), USED=block_rows if used_blocks_1 is not None else 0,
            PRE_ROUND=tiles.interpreting(a_MK.device))
    return q, s


def weight_first(quant: dict, w8a8: bool) -> bool:
    """Whether the grouped GEMM multiplies weight-first (``WFIRST``): for w8a16 with block scales,
    where the scales folded into the operand let the MMAs chain instead of scaling each chunk's
    product apart. With one scale per row the plain order chains already (the scale is applied once,
    after the loop), so there it keeps the plain order, as do the decode kernels (16-row tiles)."""
    return quant["QUANT"] and not w8a8 and not quant["LATE_SCALE"]


def weight_operand(w, w8a8: bool = False):
    """What a kernel is given for its weight ``w`` (a tensor, or a ``dispatch.quant.QuantizedTensor``)
    reduced over its last dim: (weights or codes, scale tensor, its 3 strides, constexprs).

    A plain tensor gets ``QUANT=False`` and itself as a never-read scale pointer. ``LATE_SCALE``: one
    scale covers a whole row (then w8a8 quantizes activations per token, not per 128 columns)."""
    if w8a8 and getattr(getattr(w, "q", w), "dtype", None) != torch.float8_e4m3fn:
        raise ValueError("w8a8 multiplies fp8 by fp8: the weights must be fp8 e4m3 codes (a QuantizedTensor)")
    if isinstance(w, torch.Tensor):
        w = w if w.stride(-1) == 1 else w.contiguous()  # the kernels read along a contiguous last dim
        return w, w, (0, 0, 0), dict(SBR=1, SBC=1, QUANT=False, LATE_SCALE=False)
    q = w.q if w.q.stride(-1) == 1 else w.q.contiguous()
    return q, w.scale, tuple(w.scale.stride()), kernel_constexprs(w.block_rows, w.block_cols, w.shape[2])
