"""Attention through a block table: K and V of a sequence live in blocks scattered over one pool.

Shapes: NB blocks of BS slots · KV kv heads · D head dim · NH query heads, G = NH / KV per kv head
· M block-table columns (a sequence holds at most M·BS tokens). One layer's cache is
``k_blocks`` / ``v_blocks`` [NB, BS, KV, D] (any strides, contiguous D); position p of the sequence
whose table row is ``table[r]`` sits in block ``table[r, p // BS]``, slot ``p % BS``.

    paged_decode_attention(q_BHD, k_blocks, v_blocks, table_BM, pos_B) → o_BHD
        one query row per sequence, at position pos_B[b] (its K/V already stored): attends to
        positions 0..pos_B[b] — chapter 6's flash-decoding kernel, with one extra load per key
        tile (the block ids) and the same split-K plan, partials and combine
    paged_prefill_attention(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C) → o_THD
        C chunks: chunk c is q rows q_start_C[c] .. + q_len_C[c] - 1 of one sequence, at positions
        ctx_start_C[c] + i (its K/V already stored); row i attends to positions 0..ctx_start_C[c] + i
        (the cached prefix and the chunk itself, causal). Grid (C, NH, row tiles)

Block ids are clamped to [0, NB): a bad table can give a wrong row, never a read outside the pool
(the launchers check tables and positions on CPU, where it costs no device sync). Both kernels
keep an online softmax in fp32 (scores scaled by log2(e), exp2), the P·V product in the input dtype
as the static kernel does. Plain-PyTorch twins (fp32, explicit masks): ``*_torch``; they are also
what the server runs on a CPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from dispatch import runtime
from dispatch.checks import check_launch, check_tensor
from dispatch.kernels import pdl
from dispatch.kernels.attention import LOG2E, _combine_kernel, _plan, num_splits
from dispatch.kernels.helpers import softmax_step
from dispatch.kernels.pdl import pdl_enter


@triton.jit
def _key_tile(k_cache, v_cache, tab_ptr, s, sm, kv, d, NB, BS):
    """K and V rows [BLOCK, D] of positions ``s`` (masked by ``sm``), read through a table row;
    ``k_cache`` = (k_ptr, stride_kb, stride_ks, stride_kk), ``v_cache`` likewise (strides read in place)."""
    blk = tl.load(tab_ptr + s // BS, mask=sm, other=0).to(tl.int64)
    blk = tl.minimum(tl.maximum(blk, 0), NB - 1)  # never outside the pool
    off = (s % BS).to(tl.int64)
    k = tl.load(k_cache[0] + blk[:, None] * k_cache[1] + off[:, None] * k_cache[2] + kv * k_cache[3] + d[None, :],
                mask=sm[:, None], other=0.0)
    v = tl.load(v_cache[0] + blk[:, None] * v_cache[1] + off[:, None] * v_cache[2] + kv * v_cache[3] + d[None, :],
                mask=sm[:, None], other=0.0)
    return k, v


@triton.jit
def _paged_decode_kernel(q_rows, k_cache, v_cache, tab, pos,  # (pointer, strides): read in place, q_rows[1]
                         o_ptr, m_ptr, l_ptr, acc_ptr,  # the output, or the partials when split
                         NB, BS, S, NH, G, CHUNK, SPLITS, qk_scale,  # sizes, the split plan, the score scale
                         D: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_S: tl.constexpr, PREC: tl.constexpr,
                         PARTIALS: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    b = tl.program_id(0).to(tl.int64)
    kv = tl.program_id(1)
    sp = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, D)
    h = kv * G + g
    gm = g < G
    q = tl.load(q_rows[0] + b * q_rows[1] + h[:, None] * q_rows[2] + d[None, :], mask=gm[:, None],
                other=0.0)  # [BLOCK_G, D]
    last = tl.minimum(tl.maximum(tl.load(pos[0] + b * pos[1]).to(tl.int64), -1), S - 1)  # S = M·BS
    start = sp * CHUNK
    end = tl.minimum(start + CHUNK, last + 1).to(tl.int32)
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, D], tl.float32)
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        sm = s < end
        k, v = _key_tile(k_cache, v_cache, tab[0] + b * tab[1], s, sm, kv, d, NB, BS)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC)
        qk = tl.where(sm[None, :], qk * qk_scale, float("-inf"))
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, PREC)  # finite: every tile holds a key
    if not PARTIALS:
        o = acc / l_i[:, None]
        tl.store(o_ptr + (b * NH + h[:, None]) * D + d[None, :], o.to(o_ptr.dtype.element_ty), mask=gm[:, None])
    else:  # partial slots [B, NH, SPLITS], combined by chapter 6's kernel
        row = (b * NH + h) * SPLITS + sp
        tl.store(m_ptr + row, m_i, mask=gm)
        tl.store(l_ptr + row, l_i, mask=gm)
        tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=gm[:, None])


@triton.jit
def _paged_prefill_kernel(q_rows, k_cache, v_cache, tab, o_rows,  # (pointer, strides): read in place, q_rows[1]
                          qs_ptr, ql_ptr, cs_ptr,  # each chunk's first q row, its length, its first position
                          NB, BS, G, qk_scale, D: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    c = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    mt = tl.program_id(2)
    q0 = tl.load(qs_ptr + c).to(tl.int64)
    n = tl.load(ql_ptr + c)
    p0 = tl.load(cs_ptr + c)
    i = mt * BLOCK_M + tl.arange(0, BLOCK_M)
    im = i < n
    pos = p0 + i  # [BLOCK_M] each row's position
    d = tl.arange(0, D)
    q = tl.load(q_rows[0] + (q0 + i[:, None]) * q_rows[1] + h * q_rows[2] + d[None, :], mask=im[:, None], other=0.0)
    kv = h // G
    end = tl.minimum(p0 + (mt + 1) * BLOCK_M, p0 + n).to(tl.int32)  # keys 0..end-1 cover the tile's rows
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for s0 in range(0, end, BLOCK_N):
        s = s0 + tl.arange(0, BLOCK_N)
        sm = s < end
        k, v = _key_tile(k_cache, v_cache, tab[0] + c * tab[1], s, sm, kv, d, NB, BS)
        qk = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        qk = tl.where(sm[None, :] & (s[None, :] <= pos[:, None]), qk, float("-inf"))
        m_i, l_i, acc = softmax_step(qk, v, m_i, l_i, acc, PREC)  # finite: the first tile holds key 0 <= every position
    o = acc / l_i[:, None]
    tl.store(o_rows[0] + (q0 + i[:, None]) * o_rows[1] + h * o_rows[2] + d[None, :],
             o.to(o_rows[0].dtype.element_ty), mask=im[:, None])


def _check_cache(q, k_blocks, v_blocks, table, rows: int, what: str) -> tuple[int, int, int, int, int, int]:
    """Shared checks; returns (NH, D, NB, BS, KV, M)."""
    for name, t, dims in (("q", q, 3), ("k_blocks", k_blocks, 4), ("v_blocks", v_blocks, 4), (what, table, 2)):
        check_tensor(name, t, dims=dims)
    if not q.is_floating_point() or k_blocks.dtype != q.dtype or v_blocks.dtype != q.dtype:
        raise ValueError(f"q, k and v must share one floating dtype, got {q.dtype}, {k_blocks.dtype}, {v_blocks.dtype}")
    if len({str(t.device) for t in (q, k_blocks, v_blocks, table)}) > 1:
        raise ValueError("q, the caches and the block table must be on one device")
    (_, NH, D), (NB, BS, KV, Dk) = q.shape, k_blocks.shape
    if v_blocks.shape != k_blocks.shape:
        raise ValueError(f"k and v blocks must have one shape, got {tuple(k_blocks.shape)}, {tuple(v_blocks.shape)}")
    if Dk != D or not 16 <= D <= 256 or D & (D - 1):
        raise ValueError(f"q [.., NH, D] and k/v blocks [NB, BS, KV, D] need one head dim D, a power of two in "
                         f"[16, 256]; got q {tuple(q.shape)}, k {tuple(k_blocks.shape)}")
    if NH < 1 or NH % KV:
        raise ValueError(f"the query heads NH={NH} must be a positive multiple of the kv heads KV={KV}")
    if q.stride(2) != 1 or k_blocks.stride(3) != 1 or v_blocks.stride(3) != 1:
        raise ValueError("q, k and v must have a contiguous last (D) dim")
    if table.dtype not in (torch.int32, torch.int64) or table.shape[0] != rows or table.shape[1] < 1 \
            or table.stride(1) != 1:
        raise ValueError(f"{what} must be int32/int64 [{rows}, M >= 1] with contiguous rows, got {table.dtype} "
                         f"{tuple(table.shape)}")
    if table.device.type == "cpu" and table.numel() and (int(table.min()) < 0 or int(table.max()) >= NB):
        raise ValueError(f"{what} holds block ids outside [0, NB={NB}): min {int(table.min())}, max {int(table.max())}")
    return NH, D, NB, BS, KV, table.shape[1]


def _check_ints(name: str, t, n: int) -> None:
    check_tensor(name, t, dims=1)
    if t.dtype not in (torch.int32, torch.int64) or t.shape[0] != n:
        raise ValueError(f"{name} must be int32/int64 of shape [{n}], got {t.dtype} {tuple(t.shape)}")


def _decode_check(q_BHD, k_blocks, v_blocks, table_BM, pos_B):
    NH, D, NB, BS, KV, M = _check_cache(q_BHD, k_blocks, v_blocks, table_BM, q_BHD.shape[0], "table_BM")
    _check_ints("pos_B", pos_B, q_BHD.shape[0])
    if pos_B.device.type == "cpu" and pos_B.numel() and (int(pos_B.min()) < 0 or int(pos_B.max()) >= M * BS):
        raise ValueError(f"positions must lie in [0, M·BS={M * BS}) (the table's capacity), got min "
                         f"{int(pos_B.min())}, max {int(pos_B.max())}")
    return NH, D, NB, BS, KV, M


def paged_decode_attention(q_BHD, k_blocks, v_blocks, table_BM, pos_B, scale: float | None = None, *,
                           splits: int | None = None) -> torch.Tensor:
    """softmax(q·kᵀ·scale over positions 0..pos_B[b]) · v, K/V read through ``table_BM`` → o_BHD.

    Args: q_BHD [B, NH, D]; k_blocks, v_blocks [NB, BS, KV, D] (one layer's pool); table_BM [B, M]
    block ids; pos_B [B] positions in [0, M·BS). splits: key-range splits (default from M·BS and
    B·KV, as chapter 6's kernel: static, so a CUDA graph captures it). No host sync on CUDA.
    """
    NH, D, NB, BS, KV, M = _decode_check(q_BHD, k_blocks, v_blocks, table_BM, pos_B)
    check_launch("paged_decode_attention", q_BHD)
    B, S, G = q_BHD.shape[0], M * BS, NH // KV
    o_BHD = torch.empty(B, NH, D, dtype=q_BHD.dtype, device=q_BHD.device)
    if B == 0:
        return o_BHD
    SPLITS, CHUNK, BLOCK_S = _plan(S, splits or num_splits(S, B * KV, q_BHD.device), D)
    m = l = acc = o_BHD
    if SPLITS > 1:
        m = torch.empty(B, NH, SPLITS, dtype=torch.float32, device=q_BHD.device)
        l = torch.empty_like(m)
        acc = torch.empty(B, NH, SPLITS, D, dtype=torch.float32, device=q_BHD.device)
    qk_scale = (D ** -0.5 if scale is None else float(scale)) * LOG2E
    # K and V tiles in flight: 3 stages where they fit in shared memory, else 2 (as chapter 6's kernel)
    stages = 3 if 3 * 2 * BLOCK_S * D * q_BHD.element_size() <= runtime.max_shared_bytes(q_BHD.device) else 2
    _paged_decode_kernel[(B, KV, SPLITS)](
        (q_BHD, *q_BHD.stride()[:2]), (k_blocks, *k_blocks.stride()[:3]), (v_blocks, *v_blocks.stride()[:3]),
        (table_BM, table_BM.stride(0)), (pos_B, pos_B.stride(0)), o_BHD, m, l, acc, NB, BS, S, NH, G, CHUNK, SPLITS,
        qk_scale, D=D, BLOCK_G=max(16, triton.next_power_of_2(G)), BLOCK_S=BLOCK_S,
        PREC="ieee" if q_BHD.dtype == torch.float32 else "tf32", PARTIALS=SPLITS > 1, num_warps=4, num_stages=stages,
        **pdl.launch_kw(q_BHD.device))
    if SPLITS > 1:
        _combine_kernel[(B * NH,)](m, l, acc, o_BHD, SPLITS, D=D, BLOCK_SP=triton.next_power_of_2(SPLITS),
                                   num_warps=4, **pdl.launch_kw(q_BHD.device))
    return o_BHD


def _gather(blocks, table, n: int):
    """Positions 0..n-1 through a table row [M] → [n, KV, D], or rows [B, M] → [B, n, KV, D] (fp32)."""
    BS = blocks.shape[1]
    p = torch.arange(n, device=blocks.device)
    return blocks[table.long()[..., p // BS], p % BS].float()


def paged_decode_attention_torch(q_BHD, k_blocks, v_blocks, table_BM, pos_B, scale=None) -> torch.Tensor:
    """The twin of :func:`paged_decode_attention`: gather positions 0..max(pos), mask, fp32 softmax."""
    NH, D, NB, BS, KV, M = _decode_check(q_BHD, k_blocks, v_blocks, table_BM, pos_B)
    B = q_BHD.shape[0]
    if B == 0:
        return q_BHD.new_empty(0, NH, D)
    n = int(pos_B.max()) + 1
    k, v = (_gather(c, table_BM, n) for c in (k_blocks, v_blocks))
    keep_BS = torch.arange(n, device=q_BHD.device)[None, :] <= pos_B[:, None]
    k, v = (t.masked_fill(~keep_BS[:, :, None, None], 0).repeat_interleave(NH // KV, dim=2) for t in (k, v))
    scores = torch.einsum("bhd,bshd->bhs", q_BHD.float(), k) * (D ** -0.5 if scale is None else scale)
    p = torch.softmax(scores.masked_fill(~keep_BS[:, None, :], float("-inf")), dim=-1)
    return torch.einsum("bhs,bshd->bhd", p, v).to(q_BHD.dtype)


def _prefill_check(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C):
    C = table_CM.shape[0] if isinstance(table_CM, torch.Tensor) and table_CM.dim() == 2 else -1
    NH, D, NB, BS, KV, M = _check_cache(q_THD, k_blocks, v_blocks, table_CM, C, "table_CM")
    for name, t in (("q_start_C", q_start_C), ("q_len_C", q_len_C), ("ctx_start_C", ctx_start_C)):
        _check_ints(name, t, C)
    if q_start_C.device.type == "cpu" and C:
        T = q_THD.shape[0]
        if int(q_len_C.min()) < 1 or int(q_start_C.min()) < 0 or int((q_start_C + q_len_C).max()) > T:
            raise ValueError(f"chunks must be non-empty row ranges of q (T={T}): q_start_C {q_start_C.tolist()}, "
                             f"q_len_C {q_len_C.tolist()}")
        if int(ctx_start_C.min()) < 0 or int((ctx_start_C + q_len_C).max()) > M * BS:
            raise ValueError(f"chunk positions must lie in [0, M·BS={M * BS}): ctx_start_C {ctx_start_C.tolist()}, "
                             f"q_len_C {q_len_C.tolist()}")
    return NH, D, NB, BS, KV, M


def paged_prefill_attention(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C,
                            scale: float | None = None, *, max_q_len: int | None = None) -> torch.Tensor:
    """Causal attention of C chunks over their cached prefix and themselves, K/V through ``table_CM``.

    Args: q_THD [T, NH, D]; k_blocks, v_blocks [NB, BS, KV, D]; table_CM [C, M]; q_start_C, q_len_C,
    ctx_start_C [C] (see the module docstring). ``max_q_len``: the longest chunk (default: read from
    q_len_C, a host sync on CUDA; the engine passes it). Rows of q outside every chunk are left as
    they are in the output (uninitialised). Returns o_THD [T, NH, D].
    """
    NH, D, NB, BS, KV, M = _prefill_check(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C)
    check_launch("paged_prefill_attention", q_THD)
    C = table_CM.shape[0]
    o_THD = torch.empty_like(q_THD)
    if C == 0:
        return o_THD
    longest = int(q_len_C.max()) if max_q_len is None else max_q_len
    BLOCK_M = max(16, min(64, triton.next_power_of_2(longest)))
    BLOCK_N = 64 if D <= 128 else 32
    qk_scale = (D ** -0.5 if scale is None else float(scale)) * LOG2E
    _paged_prefill_kernel[(C, NH, triton.cdiv(longest, BLOCK_M))](
        (q_THD, *q_THD.stride()[:2]), (k_blocks, *k_blocks.stride()[:3]), (v_blocks, *v_blocks.stride()[:3]),
        (table_CM, table_CM.stride(0)), (o_THD, *o_THD.stride()[:2]), q_start_C, q_len_C, ctx_start_C, NB, BS,
        NH // KV, qk_scale, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        PREC="ieee" if q_THD.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2,
        **pdl.launch_kw(q_THD.device))
    return o_THD


def paged_prefill_attention_torch(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C,
                                  scale=None, *, max_q_len: int | None = None) -> torch.Tensor:
    """The twin of :func:`paged_prefill_attention`: per chunk, gather its positions, causal mask, fp32."""
    NH, D, NB, BS, KV, M = _prefill_check(q_THD, k_blocks, v_blocks, table_CM, q_start_C, q_len_C, ctx_start_C)
    o_THD = torch.zeros_like(q_THD)
    sc = D ** -0.5 if scale is None else scale
    for c, (q0, n, p0) in enumerate(zip(q_start_C.tolist(), q_len_C.tolist(), ctx_start_C.tolist(), strict=True)):
        k, v = (_gather(b, table_CM[c], p0 + n).repeat_interleave(NH // KV, dim=1) for b in (k_blocks, v_blocks))
        scores = torch.einsum("thd,shd->hts", q_THD[q0:q0 + n].float(), k) * sc
        keys, rows = torch.arange(p0 + n, device=q_THD.device), p0 + torch.arange(n, device=q_THD.device)
        causal = keys[None, :] <= rows[:, None]
        p = torch.softmax(scores.masked_fill(~causal[None], float("-inf")), dim=-1)
        o_THD[q0:q0 + n] = torch.einsum("hts,shd->thd", p, v).to(q_THD.dtype)
    return o_THD
