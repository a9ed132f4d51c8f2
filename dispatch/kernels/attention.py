"""Decode attention: one new query token per batch row against a static KV cache (flash-decoding).

Shapes: B batch rows · S cache length (static) · NH query heads · KV kv heads · G = NH / KV query
heads per kv head · D head dim. Query head h reads kv head h // G (grouped-query attention).

    decode_attention(q_BHD, k_BSKD, v_BSKD, pos_B) → o_BHD
        row b attends to keys 0..pos_B[b] of k_BSKD[b] / v_BSKD[b] (its own token is already stored
        at pos_B[b]); caches may hold more rows than q (rows 0..B-1 are used) and any strides but a
        contiguous last dim, e.g. one layer of the engine's [L, B_max, S, KV, D] cache
    decode_attention(q, k, v, pos, queries_per_row=Q)
        Q query tokens per cache row (a verify step of chapter 9: k+1 tokens of a sequence): query r
        reads cache row r // Q and attends to keys 0..pos[r]; each query is computed exactly as if it
        were alone in a decode step (same program, same key chunks), so its bits are the same

    grid (B, KV, SPLITS): program (b, kv, s) takes the G query heads of kv head kv, keys
    [s·CHUNK, min((s+1)·CHUNK, pos_B[b] + 1)) in BLOCK_S steps, online softmax in fp32
        SPLITS == 1: it normalizes and writes o_BHD itself (one launch)
        SPLITS  > 1: it writes partials (max, sum, acc) to fp32 scratch; a second kernel, one program
                     per (b, h), combines the SPLITS partials in a fixed order (deterministic)

A program whose chunk starts past pos_B[b] runs no iteration and writes the neutral partial (max
-inf, sum 0). Keys past pos_B[b] are never loaded: garbage there (NaN, Inf) cannot leak in.

SPLITS comes from the static S and B·KV (:func:`num_splits`), never from positions (that would need
a host sync): enough programs to fill the SMs when B·KV alone does not, each chunk at least
:data:`MIN_CHUNK` keys (a short cache gets 1 split and no second launch). No host sync, static
shapes: CUDA-graph capturable. Positions must lie in [0, S): on CPU the launcher checks; on CUDA
(where checking would sync) a position past S-1 attends to all S keys and a negative one gives a
NaN row, but no read ever leaves the cache.

G heads per program: the G × BLOCK_S scores and the P·V update are ``tl.dot`` with the G query rows
padded to 16 (the smallest MMA tile), even for G == 1 (OLMoE, Qwen2-MoE: NH == KV). The wasted MMA
rows cost nothing that matters (decode attention is bound by reading K and V once), and a dot is
what Triton's software pipeliner keys on: compiled for sm_90, the dot loop streams the next K/V
tiles with asynchronous copies while it computes the current one, while a broadcast-multiply loop
(``tl.sum(q * k, 1)``) gets no asynchronous copies and waits for every tile's loads.
Plain-PyTorch twin: :func:`decode_attention_torch` (fp32, explicit mask).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.checks import check_launch, check_tensor
from dispatch.kernels import pdl
from dispatch.kernels.helpers import softmax_step
from dispatch.kernels.pdl import pdl_enter

MIN_CHUNK = 128  # fewest keys a split program takes: below that a second launch costs more than it saves
LOG2E = 1.4426950408889634


@triton.jit
def _decode_attn_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, o_ptr, m_ptr, l_ptr, acc_ptr, S, NH, G, CHUNK, SPLITS, QPR,
                        qk_scale, s_qb, s_qh, s_kb, s_ks, s_kk, s_vb, s_vs, s_vk, s_pos, D: tl.constexpr,
                        BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr, PARTIALS: tl.constexpr,
                        PDL: tl.constexpr):
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1)
    sp = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    h = kv * G + g  # the query heads of kv head kv
    gm = g < G
    q = tl.load(q_ptr + b * s_qb + h[:, None] * s_qh + d[None, :], mask=gm[:, None], other=0.0)  # [BLOCK_G, D]
    last = tl.minimum(tl.maximum(tl.load(pos_ptr + b * s_pos).to(tl.int64), -1), S - 1)  # never past the cache
    start = sp * CHUNK
    end = tl.minimum(start + CHUNK, last + 1).to(tl.int32)  # <= start: no iteration, neutral partial
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)  # running max of scores·log2(e)
    l_i = tl.zeros([BLOCK_G], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([BLOCK_G, D], tl.float32)  # running sum of exp2(score - m_i) · v
    k_row = k_ptr + (b // QPR) * s_kb + kv * s_kk  # QPR queries share a cache row (1: one each)
    v_row = v_ptr + (b // QPR) * s_vb + kv * s_vk
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        sm = s < end
        k = tl.load(k_row + s[:, None] * s_ks + d[None, :], mask=sm[:, None], other=0.0)  # [BLOCK_S, D]
        v = tl.load(v_row + s[:, None] * s_vs + d[None, :], mask=sm[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC)  # [BLOCK_G, BLOCK_S]
        qk = tl.where(sm[None, :], qk * qk_scale, float("-inf"))
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, PREC)  # finite: every step holds a key
    if not PARTIALS:
        o = acc / l_i[:, None]
        tl.store(o_ptr + (b * NH + h[:, None]) * D + d[None, :], o.to(o_ptr.dtype.element_ty), mask=gm[:, None])
    else:
        row = (b * NH + h) * SPLITS + sp  # [BLOCK_G] partial slots, laid out [B, NH, SPLITS]
        tl.store(m_ptr + row, m_i, mask=gm)
        tl.store(l_ptr + row, l_i, mask=gm)
        tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=gm[:, None])


@triton.jit
def _combine_kernel(m_ptr, l_ptr, acc_ptr, o_ptr, SPLITS, D: tl.constexpr, BLOCK_SP: tl.constexpr,
                    PDL: tl.constexpr):
    pdl_enter(PDL)
    r = tl.program_id(0).to(tl.int64)  # row b·NH + h
    sp = tl.arange(0, BLOCK_SP)
    spm = sp < SPLITS
    d = tl.arange(0, D)
    m = tl.load(m_ptr + r * SPLITS + sp, mask=spm, other=float("-inf"))
    l = tl.load(l_ptr + r * SPLITS + sp, mask=spm, other=0.0)
    acc = tl.load(acc_ptr + (r * SPLITS + sp)[:, None] * D + d[None, :], mask=spm[:, None], other=0.0)
    w = tl.exp2(m - tl.max(m, 0))  # split 0 always holds key 0, so the max is finite; neutral splits weigh 0
    o = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)
    tl.store(o_ptr + r * D + d, o.to(o_ptr.dtype.element_ty))


def num_splits(S: int, programs: int, device: torch.device | str | None = None) -> int:
    """Key-range splits for ``programs`` = B·KV (b, kv) pairs over a static cache of S keys: 1 when
    they fill the SMs, else enough to fill them, each split at least :data:`MIN_CHUNK` keys."""
    sms = runtime.num_sms(device)
    if programs >= sms:
        return 1
    return max(1, min(triton.cdiv(sms, programs), S // MIN_CHUNK))


def _plan(S: int, splits: int, D: int) -> tuple[int, int, int]:
    """(SPLITS, CHUNK, BLOCK_S) for at most ``splits`` chunks of S keys; CHUNK a multiple of BLOCK_S."""
    chunk = triton.cdiv(S, splits)
    block_s = max(16, min(64 if D <= 128 else 32, triton.next_power_of_2(chunk)))
    chunk = triton.cdiv(chunk, block_s) * block_s
    return triton.cdiv(S, chunk), chunk, block_s


def _check(q_BHD, k_BSKD, v_BSKD, pos_B, scale, splits, Q: int = 1) -> tuple[int, int, int, int, int]:
    """Validate the inputs of :func:`decode_attention` (and its twin); returns (B, NH, S, KV, D)."""
    for name, t, dims in (("q_BHD", q_BHD, 3), ("k_BSKD", k_BSKD, 4), ("v_BSKD", v_BSKD, 4), ("pos_B", pos_B, 1)):
        check_tensor(name, t, dims=dims)
    if not q_BHD.is_floating_point() or k_BSKD.dtype != q_BHD.dtype or v_BSKD.dtype != q_BHD.dtype:
        raise ValueError(f"q, k and v must share one floating dtype, got {q_BHD.dtype}, {k_BSKD.dtype}, "
                         f"{v_BSKD.dtype}")
    devices = {str(t.device) for t in (q_BHD, k_BSKD, v_BSKD, pos_B)}
    if len(devices) > 1:
        raise ValueError(f"q, k, v and pos must be on one device, got {sorted(devices)}")
    (B, NH, D), (Bc, S, KV, Dk) = q_BHD.shape, k_BSKD.shape
    if v_BSKD.shape != k_BSKD.shape:
        raise ValueError(f"k and v must have one shape, got {tuple(k_BSKD.shape)} and {tuple(v_BSKD.shape)}")
    if Dk != D or not 16 <= D <= 256 or D & (D - 1):
        raise ValueError(f"q [B, NH, D] and k/v [B, S, KV, D] need one head dim D, a power of two in [16, 256]; "
                         f"got q {tuple(q_BHD.shape)}, k {tuple(k_BSKD.shape)}")
    if NH < 1 or NH % KV:
        raise ValueError(f"the query heads NH={NH} must be a positive multiple of the kv heads KV={KV}")
    if isinstance(Q, bool) or not isinstance(Q, int) or Q < 1 or B % Q:
        raise ValueError(f"queries_per_row must be a positive int dividing q's B={B} rows, got {Q!r}")
    if Bc < B // Q or S < 1:
        raise ValueError(f"k/v [B_max, S, KV, D] need B_max >= q's B={B} rows / queries_per_row={Q} and S >= 1 "
                         f"keys, got {tuple(k_BSKD.shape)}")
    if q_BHD.stride(2) != 1 or k_BSKD.stride(3) != 1 or v_BSKD.stride(3) != 1:
        raise ValueError("q, k and v must have a contiguous last (D) dim")
    if pos_B.dtype not in (torch.int32, torch.int64) or tuple(pos_B.shape) != (B,):
        raise ValueError(f"pos_B must be int32/int64 of shape [B={B}], got {pos_B.dtype} {tuple(pos_B.shape)}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None (1/sqrt(D)), got {scale!r}")
    if splits is not None and (isinstance(splits, bool) or not isinstance(splits, int) or splits < 1):
        raise ValueError(f"splits must be a positive int or None (chosen from S and B·KV), got {splits!r}")
    if pos_B.device.type == "cpu" and B and (int(pos_B.min()) < 0 or int(pos_B.max()) >= S):
        raise ValueError(f"positions must lie in [0, S={S}), got min {int(pos_B.min())}, max {int(pos_B.max())}")
    return B, NH, S, KV, D


def decode_attention(q_BHD: torch.Tensor, k_BSKD: torch.Tensor, v_BSKD: torch.Tensor, pos_B: torch.Tensor,
                     scale: float | None = None, *, splits: int | None = None,
                     queries_per_row: int = 1) -> torch.Tensor:
    """softmax(q·kᵀ·scale over keys 0..pos_B[b]) · v for one query token per row → o_BHD in q's dtype.

    Args:
        q_BHD: [B, NH, D] queries (the engine's ``qk_rope`` output); last dim contiguous.
        k_BSKD, v_BSKD: [B_max >= B, S, KV, D] caches, rows 0..B-1 used; last dim contiguous.
        pos_B: [B] int32/int64 (any stride), each in [0, S): row b attends to keys 0..pos_B[b] inclusive.
        scale: score scale, default 1/sqrt(D).
        splits: key-range splits (at most this many; default :func:`num_splits` of S and B·KV).
        queries_per_row: Q query rows per cache row: query r reads cache row r // Q (B a multiple of Q).
    Returns: o_BHD [B, NH, D] (contiguous). One launch, two when split; no host sync on CUDA.
    """
    B, NH, S, KV, D = _check(q_BHD, k_BSKD, v_BSKD, pos_B, scale, splits, queries_per_row)
    check_launch("decode_attention", q_BHD)
    o_BHD = torch.empty(B, NH, D, dtype=q_BHD.dtype, device=q_BHD.device)
    if B == 0:
        return o_BHD
    G = NH // KV
    SPLITS, CHUNK, BLOCK_S = _plan(S, splits or num_splits(S, B * KV, q_BHD.device), D)
    qk_scale = (D ** -0.5 if scale is None else float(scale)) * LOG2E
    m = l = acc = o_BHD  # scratch only when split (never touched otherwise)
    if SPLITS > 1:
        m = torch.empty(B, NH, SPLITS, dtype=torch.float32, device=q_BHD.device)
        l = torch.empty_like(m)
        acc = torch.empty(B, NH, SPLITS, D, dtype=torch.float32, device=q_BHD.device)
    # K and V tiles in flight: 3 stages where they fit in shared memory (bf16 on sm_80+), else 2
    stages = 3 if 3 * 2 * BLOCK_S * D * q_BHD.element_size() <= runtime.max_shared_bytes(q_BHD.device) else 2
    _decode_attn_kernel[(B, KV, SPLITS)](
        q_BHD, k_BSKD, v_BSKD, pos_B, o_BHD, m, l, acc, S, NH, G, CHUNK, SPLITS, queries_per_row, qk_scale,
        q_BHD.stride(0), q_BHD.stride(1), *k_BSKD.stride()[:3], *v_BSKD.stride()[:3], pos_B.stride(0), D=D,
        BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_S=BLOCK_S, PARTIALS=SPLITS > 1,
        PREC="ieee" if q_BHD.dtype == torch.float32 else "tf32", num_warps=4, num_stages=stages,
        **pdl.launch_kw(q_BHD.device))
    if SPLITS > 1:
        _combine_kernel[(B * NH,)](m, l, acc, o_BHD, SPLITS, D=D, BLOCK_SP=triton.next_power_of_2(SPLITS),
                                   num_warps=4, **pdl.launch_kw(q_BHD.device))
    return o_BHD


def decode_attention_torch(q_BHD, k_BSKD, v_BSKD, pos_B, scale=None, *, queries_per_row: int = 1) -> torch.Tensor:
    """The twin of :func:`decode_attention`: fp32, an explicit mask (keys 0..pos_B[b]), cast once."""
    B, NH, S, KV, D = _check(q_BHD, k_BSKD, v_BSKD, pos_B, scale, None, queries_per_row)
    keep_BS = torch.arange(S, device=q_BHD.device)[None, :] <= pos_B[:, None]
    rows = torch.arange(B, device=k_BSKD.device) // queries_per_row  # the cache row of each query
    # keys past pos are zeroed as well as masked: 0 · NaN garbage would still be NaN
    k, v = (c[rows].float().masked_fill(~keep_BS[:, :, None, None], 0).repeat_interleave(NH // KV, dim=2)
            for c in (k_BSKD, v_BSKD))
    scores_BHS = torch.einsum("bhd,bshd->bhs", q_BHD.float(), k) * (D ** -0.5 if scale is None else scale)
    p_BHS = torch.softmax(scores_BHS.masked_fill(~keep_BS[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("bhs,bshd->bhd", p_BHS, v).to(q_BHD.dtype)
