"""The decode step's glue in two fused kernels (the lean forward's, :mod:`dispatch.engine.model`):
what otherwise costs ~60 launches per layer.

Written with torch ops, RMSNorm is 8 kernels (4 per layer), rotary embedding ~10, plus the
residual adds: at batch 1 each is a launch and a ramp for a few KB of work (chapter 6's profile
times this glue against the experts). Fused:

    add_rms(x_TH, d_TH, w_H)   x ← x + d (in place, the residual stream), returns RMSNorm(x)·w
                               one program per row; fp32 statistics, as transformers' RMSNorm
    qk_rope(qkv_TC, ...)       per row: q/k RMSNorm (over all heads, per head, or none), RoPE at
                               the row's position, K and V stored into the cache at that position,
                               q returned [T, NH, D] — one launch

Each has a plain-PyTorch twin (``add_rms_torch``, ``qk_rope_torch``) that the tests compare with.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from dispatch.kernels import pdl
from dispatch.kernels.pdl import pdl_enter, pdl_release, pdl_wait

NORMS = {"none": 0, "full": 1, "head": 2}


@triton.jit
def _add_rms_kernel(x_ptr, d_ptr, w_ptr, out_ptr, H, eps, HAS_D: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    m = offs < H
    pdl_release(PDL)
    w = tl.load(w_ptr + offs, mask=m, other=0.0)  # the norm's weight: read before the PDL wait
    pdl_wait(PDL)
    x = tl.load(x_ptr + row * H + offs, mask=m, other=0.0)
    if HAS_D:
        d = tl.load(d_ptr + row * H + offs, mask=m, other=0.0)
        x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)
        tl.store(x_ptr + row * H + offs, x, mask=m)
    xf = x.to(tl.float32)
    y = (xf * tl.rsqrt(tl.sum(xf * xf, 0) / H + eps)).to(x.dtype)
    tl.store(out_ptr + row * H + offs, (w.to(tl.float32) * y.to(tl.float32)).to(x.dtype), mask=m)


def add_rms(x_TH: torch.Tensor, d_TH: torch.Tensor | None, w_H: torch.Tensor, eps: float) -> torch.Tensor:
    """x_TH += d_TH (in place; skipped when None); returns RMSNorm(x_TH) · w_H."""
    if x_TH.dim() != 2 or not x_TH.is_contiguous() or w_H.shape != (x_TH.shape[1],):
        raise ValueError(f"x must be a contiguous [T, H] tensor and w [H]; got {tuple(x_TH.shape)}, "
                         f"{tuple(w_H.shape)}")
    if d_TH is not None and (d_TH.shape != x_TH.shape or not d_TH.is_contiguous()):
        raise ValueError(f"d must be a contiguous tensor shaped like x {tuple(x_TH.shape)}, got {tuple(d_TH.shape)}")
    T, H = x_TH.shape
    out = torch.empty_like(x_TH)
    if T:
        _add_rms_kernel[(T,)](x_TH, d_TH if d_TH is not None else x_TH, w_H, out, H, eps,
                              HAS_D=d_TH is not None, BLOCK=triton.next_power_of_2(H), num_warps=8,
                              **pdl.launch_kw(x_TH.device))
    return out


def add_rms_torch(x_TH, d_TH, w_H, eps):
    """The twin of :func:`add_rms` (same in-place residual update)."""
    if d_TH is not None:
        x_TH += d_TH
    xf = x_TH.float()
    return w_H * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x_TH.dtype)


@triton.jit
def _inv_rms(x, eps, NORM: tl.constexpr, NHEADS, D: tl.constexpr):
    """1/rms of an [NH, D] tile: over everything (NORM 1, [1, 1]) or per head (NORM 2, [NH, 1])."""
    ss = tl.sum(x * x, 1)[:, None]
    if NORM == 2:
        ms = ss / D
    else:
        ms = tl.sum(ss, 0)[None, :] / (NHEADS * D)
    return tl.rsqrt(ms + eps)


@triton.jit
def _normed(x, inv, w_ptr, h, cols, hmask, NORM: tl.constexpr, D: tl.constexpr):
    """transformers' RMSNorm output at columns ``cols``: (x·inv → dtype) · w, rounded to dtype."""
    dt = w_ptr.dtype.element_ty
    if NORM == 1:
        w = tl.load(w_ptr + h * D + cols, mask=hmask, other=0.0).to(tl.float32)
    else:
        w = tl.load(w_ptr + cols + h * 0, mask=hmask, other=0.0).to(tl.float32)
    return ((x * inv).to(dt).to(tl.float32) * w).to(dt).to(tl.float32)


@triton.jit
def _norm_rope(base_ptr, w_ptr, h, d, hmask, cos, sin, eps, NORM: tl.constexpr, NHEADS, D: tl.constexpr):
    """Load an [NH, D] tile, RMSNorm it (NORM), then x·cos + rotate_half(x)·sin in fp32."""
    half: tl.constexpr = D // 2
    partner = tl.where(d < half, d + half, d - half)
    x = tl.load(base_ptr + h * D + d, mask=hmask, other=0.0).to(tl.float32)
    xp = tl.load(base_ptr + h * D + partner, mask=hmask, other=0.0).to(tl.float32)
    if NORM != 0:
        inv = _inv_rms(x, eps, NORM, NHEADS, D)
        x = _normed(x, inv, w_ptr, h, d, hmask, NORM, D)
        xp = _normed(xp, inv, w_ptr, h, partner, hmask, NORM, D)
    return x * cos + tl.where(d < half, -xp, xp) * sin


@triton.jit
def _qk_rope_kernel(qkv_ptr, qn_ptr, kn_ptr, inv_ptr, pos_ptr, q_ptr, kc_ptr, vc_ptr, S, s_row, s_cb, s_cs,
                    eps, scale, NH, NKV, NORM: tl.constexpr, D: tl.constexpr, BLOCK_NH: tl.constexpr,
                    BLOCK_KV: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)
    b, pos = r // S, tl.load(pos_ptr + r)
    d = tl.arange(0, D)[None, :]
    f = pos.to(tl.float32) * tl.load(inv_ptr + (d % (D // 2)))
    dt = q_ptr.dtype.element_ty
    cos = (tl.cos(f) * scale).to(dt).to(tl.float32)
    sin = (tl.sin(f) * scale).to(dt).to(tl.float32)
    row = qkv_ptr + r * s_row
    h = tl.arange(0, BLOCK_NH)[:, None]
    hm = (h < NH) & (d < D)
    q = _norm_rope(row, qn_ptr, h, d, hm, cos, sin, eps, NORM, NH, D)
    tl.store(q_ptr + r * NH * D + h * D + d, q.to(dt), mask=hm)
    h = tl.arange(0, BLOCK_KV)[:, None]
    hm = (h < NKV) & (d < D)
    k = _norm_rope(row + NH * D, kn_ptr, h, d, hm, cos, sin, eps, NORM, NKV, D)
    dst = b * s_cb + pos * s_cs + h * D + d
    tl.store(kc_ptr + dst, k.to(dt), mask=hm)
    v = tl.load(row + (NH + NKV) * D + h * D + d, mask=hm, other=0.0)
    tl.store(vc_ptr + dst, v, mask=hm)


def qk_rope(qkv_TC: torch.Tensor, pos_T: torch.Tensor, S: int, q_norm, k_norm, norm: str, inv_freq_F, scale: float,
            eps: float, k_cache_BSkD: torch.Tensor, v_cache_BSkD: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows t = b·S + s of ``qkv_TC`` [T, (NH + 2·NKV)·D]: q/k norm, RoPE at ``pos_T[t]``; K, V stored at
    cache[b, pos_T[t]]; returns q [T, NH, D]. Caches are one layer's [B, S_cache, NKV, D] (contiguous rows)."""
    T, C = qkv_TC.shape
    Bc, Sc, NKV, D = k_cache_BSkD.shape
    if norm not in NORMS or C != (num_heads + 2 * NKV) * D or qkv_TC.stride(1) != 1 or D & (D - 1) or D < 2:
        raise ValueError(f"qkv must be [T, (NH + 2 NKV) D] = [T, {(num_heads + 2 * NKV) * D}] with D a power of two, "
                         f"norm one of {tuple(NORMS)}; got {tuple(qkv_TC.shape)}, D={D}, norm={norm!r}")
    if k_cache_BSkD.stride(2) != D or k_cache_BSkD.stride() != v_cache_BSkD.stride() or T % S:
        raise ValueError("the caches must share strides with contiguous [NKV, D] rows, and T a multiple of S")
    q = torch.empty(T, num_heads, D, dtype=qkv_TC.dtype, device=qkv_TC.device)
    if T:
        w = q_norm if q_norm is not None else qkv_TC
        _qk_rope_kernel[(T,)](qkv_TC, w, k_norm if k_norm is not None else qkv_TC, inv_freq_F, pos_T, q,
                              k_cache_BSkD, v_cache_BSkD, S, qkv_TC.stride(0), k_cache_BSkD.stride(0),
                              k_cache_BSkD.stride(1), eps, scale, num_heads, NKV, NORM=NORMS[norm], D=D,
                              BLOCK_NH=triton.next_power_of_2(num_heads), BLOCK_KV=triton.next_power_of_2(NKV),
                              num_warps=4, **pdl.launch_kw(qkv_TC.device))
    return q


def _rms_torch(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def qk_rope_torch(qkv_TC, pos_T, S, q_norm, k_norm, norm, inv_freq_F, scale, eps, k_cache_BSkD, v_cache_BSkD,
                  num_heads):
    """The twin of :func:`qk_rope`, op for op as transformers computes it (cos/sin cast to the dtype)."""
    T = qkv_TC.shape[0]
    NKV, D = k_cache_BSkD.shape[2], k_cache_BSkD.shape[3]
    q, k, v = qkv_TC.split([num_heads * D, NKV * D, NKV * D], dim=-1)
    if norm == "full":
        q, k = _rms_torch(q, q_norm, eps), _rms_torch(k, k_norm, eps)
    q, k, v = q.reshape(T, num_heads, D), k.reshape(T, NKV, D), v.reshape(T, NKV, D)
    if norm == "head":
        q, k = _rms_torch(q, q_norm, eps), _rms_torch(k, k_norm, eps)
    freqs = pos_T[:, None].float() * inv_freq_F.to(pos_T.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * scale).to(q.dtype)[:, None], (emb.sin() * scale).to(q.dtype)[:, None]
    q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    b_T = torch.arange(T, device=qkv_TC.device) // S
    k_cache_BSkD[b_T, pos_T] = k
    v_cache_BSkD[b_T, pos_T] = v
    return q
