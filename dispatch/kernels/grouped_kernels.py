"""Triton kernels of the grouped GEMM; the launchers and the story are in :mod:`dispatch.kernels.grouped_gemm`.

One program = one (block of BLOCK_M sorted rows, column tile). The weights are bf16/fp16/fp32, or
8-bit codes with fp32 scales (``QUANT``, chapter 7): the constexpr switch of
:mod:`dispatch.kernels.quant_kernels`; ``QUANT=False`` compiles to the plain ``tl.dot``. ``TMA``
(Hopper, :mod:`dispatch.kernels.tma`): the weight tiles (and down's h tiles) come by descriptor
loads (``w_desc``, ``h_desc``) instead of pointer loads; otherwise those arguments are unused.

Each operand comes as one tuple, its pointer then its strides, named as Triton's tutorials name them
(``stride_xt``: x's stride along t): x ``(x_ptr, stride_xt, stride_xh)``, the weights ``(w_ptr,
stride_we, stride_wn, stride_wk)``, h and out likewise, the weight scales ``(s_ptr, stride_se,
stride_sr, stride_sc)`` and the activation scales ``(as_ptr, stride_as)``. The kernels read a stride
in place (``x[1]`` is stride_xt), never unpacked into a variable: a launch makes a unit stride the
constant 1 (:data:`GROUPS`), and an assignment would turn that constant into a value.
"""
import triton
import triton.language as tl

from dispatch.kernels.helpers import gated
from dispatch.kernels.pdl import pdl_enter, pdl_exit
from dispatch.kernels.quant_kernels import _act_scales, _block_scales, _qacc, _qdot, _qout

# each operand tuple's elements, by name (x, w, h, out: the activations, weights, hidden rows, output rows)
GROUPS = dict(x=("x_ptr", "stride_xt", "stride_xh"), w=("w_ptr", "stride_we", "stride_wn", "stride_wk"),
               h=("h_ptr", "stride_hp", "stride_hi"), out=("out_ptr", "stride_on", "stride_oh"),
               s=("s_ptr", "stride_se", "stride_sr", "stride_sc"), a_s=("as_ptr", "stride_as"))


@triton.jit
def _up_tile(pid_b, pid_n, e,
             x, w, h, s, a_s,  # operands: (pointer, strides)
             rows_ptr, N, H, I,  # the sorted slots' routed rows (padding: N); sizes
             w_desc,  # the weights' TMA descriptor (TMA only)
             TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             EVEN_K: tl.constexpr,  # tiles
             SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
             LATE_SCALE: tl.constexpr, WFIRST: tl.constexpr,  # quantization (chapter 7)
             TMA: tl.constexpr, ACT: tl.constexpr):
    """One output tile of the up kernel: block pid_b (expert e) × columns pid_n of h = act(gate) · up
    (``ACT``: the gated activation's code, :mod:`dispatch.activations`).

    ``QUANT``: w holds 8-bit codes, s their fp32 scales; ``W8A8``: x holds fp8 codes too, a_s their
    scales (:mod:`dispatch.kernels.quant_kernels`)."""
    x_ptr, w_ptr, h_ptr, s_ptr, as_ptr = x[0], w[0], h[0], s[0], a_s[0]  # strides: read in place (GROUPS)
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m)
    valid_m = rows < N  # padding slots hold N
    t = (rows // TOP_K).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + t[:, None] * x[1] + offs_k[None, :] * x[2]                   # [BM, BK]
    g_ptrs = w_ptr + e * w[1] + offs_n[None, :] * w[2] + offs_k[:, None] * w[3]  # [BK, BN]
    u_ptrs = g_ptrs + I * w[2]
    n0 = (e * 2 * I + pid_n * BLOCK_N).to(tl.int32)  # TMA: the gate rows' first row in w as [E·2I, H]
    s_e = s_ptr + e * s[1]  # this expert's scales (QUANT only)
    acc_g = _qacc(BLOCK_M, BLOCK_N, WFIRST)
    acc_u = _qacc(BLOCK_M, BLOCK_N, WFIRST)
    for k0 in range(0, tl.cdiv(H, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=valid_m[:, None], other=0.0)
        else:
            mask_k = offs_k < H - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=valid_m[:, None] & mask_k[None, :], other=0.0)
        if TMA:  # the copy engine brings both weight tiles (zeros past H)
            bg = w_desc.load([n0, k0 * BLOCK_K]).T
            bu = w_desc.load([n0 + I, k0 * BLOCK_K]).T
        elif EVEN_K:
            bg = tl.load(g_ptrs, mask=mask_n[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            bg = tl.load(g_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            bu = tl.load(u_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        sg = _block_scales(s_e, offs_n, k0 * BLOCK_K, mask_n, s[2], s[3], SBR, SBC, QUANT)
        su = _block_scales(s_e, I + offs_n, k0 * BLOCK_K, mask_n, s[2], s[3], SBR, SBC, QUANT)
        sa = _act_scales(as_ptr, t, k0 * BLOCK_K, valid_m, a_s[1], W8A8)
        acc_g = _qdot(a, sa, bg, sg, acc_g, QUANT, W8A8, LATE_SCALE, WFIRST)
        acc_u = _qdot(a, sa, bu, su, acc_u, QUANT, W8A8, LATE_SCALE, WFIRST)
        a_ptrs += BLOCK_K * x[2]
        g_ptrs += BLOCK_K * w[3]
        u_ptrs += BLOCK_K * w[3]
    acc_g = _qout(acc_g, WFIRST)
    acc_u = _qout(acc_u, WFIRST)
    if LATE_SCALE:  # one scale per row (w8a8: and per token): applied once, before the SwiGLU
        sa = _act_scales(as_ptr, t, 0, valid_m, a_s[1], W8A8)[:, None]
        acc_g *= sa * _block_scales(s_e, offs_n, 0, mask_n, s[2], s[3], SBR, SBC, QUANT)[None, :]
        acc_u *= sa * _block_scales(s_e, I + offs_n, 0, mask_n, s[2], s[3], SBR, SBC, QUANT)[None, :]
    act = gated(acc_g, acc_u, ACT)  # the gated activation in fp32, in registers
    h_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * h[1] + offs_n[None, :] * h[2]
    tl.store(h_ptrs, act.to(h_ptr.dtype.element_ty), mask=mask_n[None, :])


@triton.jit
def _swizzle(GROUP_M: tl.constexpr):
    """(block, column tile) of this program. Launch order walks GROUP_M blocks × every column tile,
    then the next GROUP_M blocks: programs in flight together share x rows and weight tiles in L2."""
    pid_b, pid_n = tl.program_id(0), tl.program_id(1)
    if GROUP_M > 1:
        nb = tl.num_programs(0)
        pid = pid_n * nb + pid_b  # the hardware's launch order (x fastest)
        width = GROUP_M * tl.num_programs(1)
        first = (pid // width) * GROUP_M
        rows = tl.minimum(nb - first, GROUP_M)
        pid_b = first + (pid % width) % rows
        pid_n = (pid % width) // rows
    return pid_b, pid_n


@triton.jit
def _up_swiglu_kernel(x, w, h, s, a_s,  # operands: (pointer, strides)
                      rows_ptr, bexp_ptr,  # the sort: each slot's routed row, each block's expert
                      N, H, I, N_BUCKET,  # sizes
                      w_desc,  # the weights' TMA descriptor (TMA only)
                      TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EVEN_K: tl.constexpr, GROUP_M: tl.constexpr,  # tiles and their launch order
                      SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
                      LATE_SCALE: tl.constexpr, WFIRST: tl.constexpr,  # quantization (chapter 7)
                      PDL: tl.constexpr, TMA: tl.constexpr, ACT: tl.constexpr):
    pdl_enter(PDL)  # chapter 6: wait for the sort
    pid_b, pid_n = _swizzle(GROUP_M)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:  # blocks past the used ones do nothing
        _up_tile(pid_b, pid_n, e, x, w, h, s, a_s, rows_ptr, N, H, I, w_desc, TOP_K, BLOCK_M, BLOCK_N, BLOCK_K,
                 EVEN_K, SBR, SBC, QUANT, W8A8, LATE_SCALE, WFIRST, TMA, ACT)
    pdl_exit(PDL)


@triton.jit
def _down_tile(pid_b, pid_n, e,
               h, w, out, s, a_s,  # operands: (pointer, strides)
               rows_ptr, wts_ptr, N, H, I,  # the sorted slots' routed rows, the routing weights; sizes
               h_desc, w_desc,  # h's and the weights' TMA descriptors (TMA only)
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,  # tiles
               SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
               LATE_SCALE: tl.constexpr, WFIRST: tl.constexpr,  # quantization (chapter 7)
               TMA: tl.constexpr):
    """One output tile of the down kernel: block pid_b (expert e) × columns pid_n of out (``QUANT``,
    ``W8A8`` as in the up kernel; a_s: the scales of h's slots)."""
    h_ptr, w_ptr, out_ptr, s_ptr, as_ptr = h[0], w[0], out[0], s[0], a_s[0]  # strides: read in place (GROUPS)
    offs_m = pid_b * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + offs_m)
    valid_m = rows < N
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < H
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = h_ptr + offs_m[:, None].to(tl.int64) * h[1] + offs_k[None, :] * h[2]    # [BM, BK], slot order
    b_ptrs = w_ptr + e * w[1] + offs_n[None, :] * w[2] + offs_k[:, None] * w[3]      # [BK, BN]
    m0, n0 = pid_b * BLOCK_M, (e * H + pid_n * BLOCK_N).to(tl.int32)  # TMA: h as [P, I], w as [E·H, I]
    s_e = s_ptr + e * s[1]
    acc = _qacc(BLOCK_M, BLOCK_N, WFIRST)
    for k0 in range(0, tl.cdiv(I, BLOCK_K)):
        if TMA:  # both tiles by the copy engine (zeros past I)
            a = h_desc.load([m0, k0 * BLOCK_K])
            b = w_desc.load([n0, k0 * BLOCK_K]).T
        elif EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:
            mask_k = offs_k < I - k0 * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_k[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        s_n = _block_scales(s_e, offs_n, k0 * BLOCK_K, mask_n, s[2], s[3], SBR, SBC, QUANT)
        sa = _act_scales(as_ptr, offs_m, k0 * BLOCK_K, valid_m, a_s[1], W8A8)
        acc = _qdot(a, sa, b, s_n, acc, QUANT, W8A8, LATE_SCALE, WFIRST)
        a_ptrs += BLOCK_K * h[2]
        b_ptrs += BLOCK_K * w[3]
    acc = _qout(acc, WFIRST)
    if LATE_SCALE:
        sa = _act_scales(as_ptr, offs_m, 0, valid_m, a_s[1], W8A8)[:, None]
        acc *= sa * _block_scales(s_e, offs_n, 0, mask_n, s[2], s[3], SBR, SBC, QUANT)[None, :]
    wt = tl.load(wts_ptr + rows, mask=valid_m, other=0.0)  # routing weight of each row, fp32
    acc = acc * wt[:, None]
    o_ptrs = out_ptr + rows[:, None].to(tl.int64) * out[1] + offs_n[None, :] * out[2]  # row n: written once
    tl.store(o_ptrs, acc.to(out_ptr.dtype.element_ty), mask=valid_m[:, None] & mask_n[None, :])



@triton.jit
def _down_kernel(h, w, out, s, a_s,  # operands: (pointer, strides)
                 rows_ptr, bexp_ptr, wts_ptr,  # the sort: each slot's routed row, each block's expert; weights
                 N, H, I, N_BUCKET,  # sizes
                 h_desc, w_desc,  # h's and the weights' TMA descriptors (TMA only)
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 GROUP_M: tl.constexpr,  # tiles and their launch order
                 SBR: tl.constexpr, SBC: tl.constexpr, QUANT: tl.constexpr, W8A8: tl.constexpr,
                 LATE_SCALE: tl.constexpr, WFIRST: tl.constexpr,  # quantization (chapter 7)
                 PDL: tl.constexpr, TMA: tl.constexpr):
    pdl_enter(PDL)
    pid_b, pid_n = _swizzle(GROUP_M)
    e = tl.load(bexp_ptr + pid_b).to(tl.int64)
    if e >= 0:
        _down_tile(pid_b, pid_n, e, h, w, out, s, a_s, rows_ptr, wts_ptr, N, H, I, h_desc, w_desc,
                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SBR, SBC, QUANT, W8A8, LATE_SCALE, WFIRST, TMA)
    pdl_exit(PDL)
