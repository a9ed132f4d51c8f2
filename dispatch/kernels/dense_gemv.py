"""A dense GEMV for decode's projections: y_MN = x_MK @ w_NK.T (+ bias_N) for 1..16 rows.

At decode sizes a projection (the fused QKV [6144, 2048], O [2048, 2048] and lm_head [50304, 2048]
of OLMoE) does ~1 FLOP per weight byte: its time is the time to read W once. So each program owns
``block_n`` rows of W (outputs) and streams them along K (contiguous: 16-byte vector loads), doing
the whole K reduction itself — no split-K partial sums, no atomics, so results are deterministic.
The grid is cdiv(N, block_n) programs; the tile policy (:func:`dispatch.kernels.tile_rules.heuristic_dense`)
picks ``block_n`` so that there are >= 2 programs per SM (every SM keeps several row streams in flight).

Two variants, one kernel (constexpr ``DOT``):

    M == 1     acc[BLOCK_N, BLOCK_K] += w · x  (fp32, elementwise), summed over K once at the end:
               no padded rows, no tensor cores — pure streaming
    M = 2..16  acc[16, BLOCK_N] = tl.dot(x padded to 16 rows, w.T): rows masked; ``block_n`` is
               raised to 16 (tl.dot's smallest tile)

Batch-invariant mode (``invariant=True``, chapter 9): any number of rows, always the ``tl.dot``
variant on 16-row tiles, one config chosen from (N, K) alone (``tile_rules.invariant_dense``).
Program p owns output tile (p // m_tiles, p % m_tiles): the programs sharing a W tile run side by
side, so W is streamed from memory about once. A row's result then depends on its own x only: the MMA of
row r reads row r of x, and the K order is fixed by ``block_k`` — the same bits for M = 1 and 300.
(The default is not so: at M = 1 the elementwise variant sums in another order than tl.dot.)

Worked example: x = [[1, 2]], w = [[1, 0], [0, 1], [1, 1]], bias = [0.5, 0, -1] → y = [[1.5, 2, 2]].
Shape legend: M rows (tokens) · N outputs · K inputs (H for the projections). fp32 accumulation,
bias added in fp32, rounded once to x's dtype. Plain-PyTorch twin: :func:`linear_small_torch`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from dispatch.checks import check_launch
from dispatch.kernels import pdl, tiles
from dispatch.kernels.pdl import pdl_release, pdl_wait
from dispatch.kernels.tiles import DENSE_CONFIGS, DenseGemvConfig, heuristic_dense, invariant_dense  # noqa: F401  (re-exported)

MAX_ROWS = 16  # the tl.dot variant pads the rows to one 16-row tile


@triton.jit
def _gemv_step(acc, w_NK, x_row, offs_k, mask_m, K, DOT: tl.constexpr, PRECISION: tl.constexpr):
    """acc += this K step's x columns times its W tile (the x load comes after any PDL wait)."""
    x_MK = tl.load(x_row + offs_k[None, :], mask=mask_m[:, None] & (offs_k < K)[None, :], other=0.0)
    if DOT:
        acc = tl.dot(x_MK, tl.trans(w_NK), acc, input_precision=PRECISION)
    else:  # x_MK is [1, BLOCK_K]: broadcast over W's rows
        acc += w_NK.to(tl.float32) * x_MK.to(tl.float32)
    return acc


@triton.jit
def _dense_gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, s_xm, s_wn, s_b, s_ym,
                       HAS_BIAS: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, PDL: tl.constexpr):
    """Program p: y's column tile p // R, row tile p % R (R = cdiv(M, BLOCK_M): 1 but in batch-invariant mode),
    over all of K. The first W tile is loaded before the PDL wait (no kernel writes weights), x after it."""
    BLOCK_M: tl.constexpr = 16 if DOT else 1
    offs_n = (tl.program_id(0) // tl.cdiv(M, BLOCK_M)) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = (tl.program_id(0) % tl.cdiv(M, BLOCK_M)) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n, mask_m = offs_n < N, offs_m < M
    w_row = w_ptr + offs_n.to(tl.int64)[:, None] * s_wn  # [BLOCK_N, 1]; K contiguous
    x_row = x_ptr + offs_m.to(tl.int64)[:, None] * s_xm  # [BLOCK_M, 1]
    if DOT:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    pdl_release(PDL)
    offs_k = tl.max_contiguous(tl.multiple_of(tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
    w_NK = tl.load(w_row + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)
    pdl_wait(PDL)
    acc = _gemv_step(acc, w_NK, x_row, offs_k, mask_m, K, DOT, PRECISION)
    for k0 in tl.range(BLOCK_K, K, BLOCK_K, num_stages=NUM_STAGES):
        offs_k = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        w_NK = tl.load(w_row + offs_k[None, :], mask=mask_n[:, None] & (offs_k < K)[None, :], other=0.0)
        acc = _gemv_step(acc, w_NK, x_row, offs_k, mask_m, K, DOT, PRECISION)
    if DOT:
        y_MN = acc
    else:
        y_MN = tl.sum(acc, axis=1)[None, :]  # [1, BLOCK_N]
    if HAS_BIAS:
        y_MN += tl.load(b_ptr + offs_n * s_b, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m.to(tl.int64)[:, None] * s_ym + offs_n[None, :]
    tl.store(y_ptrs, y_MN.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _check(x_MK, w_NK, bias_N, config, invariant: bool = False) -> tuple[int, int, int]:
    """(M, N, K) of valid inputs; a ValueError naming what was expected otherwise."""
    if not isinstance(x_MK, torch.Tensor) or not isinstance(w_NK, torch.Tensor):
        raise ValueError("x and w must be torch.Tensors")
    if x_MK.dim() != 2 or w_NK.dim() != 2:
        raise ValueError(f"x must be [M, K] and w [N, K] (2-D), got {tuple(x_MK.shape)} and {tuple(w_NK.shape)}")
    (M, K), (N, Kw) = x_MK.shape, w_NK.shape
    if K != Kw:
        raise ValueError(f"x [M, K] and w [N, K] must share K, got x {tuple(x_MK.shape)} and w {tuple(w_NK.shape)}")
    if x_MK.dtype not in (torch.float32, torch.float16, torch.bfloat16) or w_NK.dtype != x_MK.dtype:
        raise ValueError(f"x and w must share one float dtype (float32, float16, bfloat16), got {x_MK.dtype} "
                         f"and {w_NK.dtype}")
    if w_NK.device != x_MK.device:
        raise ValueError(f"x and w must be on the same device, got {x_MK.device} and {w_NK.device}")
    if M > MAX_ROWS and not invariant:
        raise ValueError(f"linear_small takes 1..{MAX_ROWS} rows, got M={M}: use F.linear for more "
                         "(or invariant=True)")
    if K > 1 and (x_MK.stride(1) != 1 or w_NK.stride(1) != 1):
        raise ValueError(f"x and w must have a contiguous last dim (stride 1), got strides {x_MK.stride()} "
                         f"and {w_NK.stride()}")
    if bias_N is not None and (not isinstance(bias_N, torch.Tensor) or bias_N.shape != (N,)
                               or bias_N.dtype != x_MK.dtype or bias_N.device != x_MK.device):
        got = (tuple(bias_N.shape), bias_N.dtype, bias_N.device) if isinstance(bias_N, torch.Tensor) else bias_N
        raise ValueError(f"bias must be a [N] = [{N}] tensor of x's dtype and device ({x_MK.dtype}, "
                         f"{x_MK.device}), got {got}")
    if config is not None and not isinstance(config, DenseGemvConfig):
        raise ValueError(f"config must be a DenseGemvConfig, got {type(config).__name__}")
    check_launch("linear_small", x_MK)
    return M, N, K


def linear_small(x_MK: torch.Tensor, w_NK: torch.Tensor, bias_N: torch.Tensor | None = None, *,
                 config: DenseGemvConfig | None = None, invariant: bool = False) -> torch.Tensor:
    """y_MN = x_MK @ w_NK.T (+ bias_N) for M <= 16 rows, streaming W once (what F.linear computes).

    One launch, no host sync (CUDA-graph capturable), deterministic.

    Args:
        x_MK: [M, K], 0 <= M <= 16, float32/float16/bfloat16 (bf16 on CUDA only), last dim contiguous.
        w_NK: [N, K], x's dtype and device, last dim contiguous. bias_N: [N] or None, x's dtype.
        config: launch config (default: ``tiles.resolve("dense", ...)``, :func:`heuristic_dense`; with
            ``invariant``: ``tiles.resolve("dense_invariant", ...)``, :func:`invariant_dense`).
        invariant: batch-invariant mode: any M, row r's bits independent of M (module docstring).
    Returns: y_MN [M, N] in x's dtype (fp32 accumulation, bias added in fp32, one rounding).
    """
    M, N, K = _check(x_MK, w_NK, bias_N, config, invariant)
    y_MN = torch.empty(M, N, dtype=x_MK.dtype, device=x_MK.device)
    if M == 0 or N == 0:
        return y_MN
    kind = "dense_invariant" if invariant else "dense"
    cfg = tiles.resolve(kind, (M, N, K), x_MK.dtype, x_MK.device, config=config).config
    dot = M > 1 or invariant
    block_n = cfg.rows(2 if dot else 1)
    m_tiles = triton.cdiv(M, MAX_ROWS) if dot else 1
    b = bias_N if bias_N is not None else y_MN  # never read without a bias
    _dense_gemv_kernel[(triton.cdiv(N, block_n) * m_tiles,)](
        x_MK, w_NK, b, y_MN, M, N, K, x_MK.stride(0), w_NK.stride(0), b.stride(0), y_MN.stride(0),
        HAS_BIAS=bias_N is not None, DOT=dot, PRECISION="ieee" if x_MK.dtype == torch.float32 else "tf32",
        BLOCK_N=block_n, BLOCK_K=cfg.block_k, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps,
        **pdl.launch_kw(x_MK.device))
    return y_MN


def linear_small_torch(x_MK: torch.Tensor, w_NK: torch.Tensor, bias_N: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-PyTorch twin of :func:`linear_small`: F.linear in fp32 (bias included), cast once."""
    bias = bias_N.float() if bias_N is not None else None
    return F.linear(x_MK.float(), w_NK.float(), bias).to(x_MK.dtype)
