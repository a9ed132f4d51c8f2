"""Batch-invariant mode: a row's logits are the same bits in a step of 1 row or of 300.

Why it matters (chapter 9): a speculative verify step runs k+1 tokens of a sequence through the
model at once, where plain decoding runs them one step each. Floating-point addition is not
associative, so a kernel that reduces a row (a dot product over H, a sum over keys, a softmax's
denominator) in an order that depends on how many rows share the step gives the row other bits
at T = k+1 than at T = 1, and a near-tie between two tokens can flip the argmax. Orders that
depend on the rows: a GEMV that switches from FMAs at one row to tensor-core tiles at two, a
split-K or a tile picked per row count, a crossover from the decode kernels to the grouped GEMM,
attention that splits the keys over more programs when fewer rows are in flight, a routing tile
of a size that follows T. In this mode every op of a decode or verify step reduces each row in an
order fixed by the model's shapes (and the device), never by the number of rows:

    op                                    kernel                              what is fixed
    RMSNorm + residual, q/k norm + RoPE   ``fused.add_rms``, ``fused.qk_rope``   one program per row (as is)
    QKV, O, lm_head, dense MLPs,          ``linear_small(invariant=True)``    tl.dot on 16-row tiles for
      the gated shared expert                                                 every M, one config from (N, K)
    attention                             ``decode_attention``                key chunks from the cache
                                          (``splits=attention_splits(...)``)   length S and KV, not from B
    router + top-K                        ``fused_moe.router_topk``           one program per token,
                                                                              tiles from (E, H)
    routed experts + k-order combine      ``moe_decode(config=decode_tiles)``  the decode path at every T,
                                                                              one DecodeConfig
    next token                            ``argmax``                          exact (no rounding)

Elementwise ops are invariant on a GPU, but not all of them on a CPU: torch's vectorised SiLU and
sigmoid compute an element in the vector body or in the scalar tail depending on where it sits in
the tensor, and the two round differently. The SwiGLU products and the shared expert's gate run in
one small kernel here (:func:`silu_mul`: one program per row and column tile, the same tile shape
for every row); additions and products (the residual, the shared expert's sum) round exactly. Why the
kernels above are row-invariant once their tiles are fixed: a ``tl.dot`` output row is computed
from its own input row only (the MMA's reduction over a K step has a fixed order), the experts
kernels apply an expert's tile to its rows 16 at a time with the reduction over H or I in
``block_h`` / ``block_id`` chunks whichever rows share the tile, and the combine sums a token's
K rows in k order. Which program handles which row (grid sizes, ``programs``) may follow T: it
moves work, not the order of a sum. On a CPU the kernels run under Triton's interpreter.

Prefill is not part of it (it keeps cuBLAS and SDPA): a verify step and the decode steps it
replaces start from the same prefilled cache, which is what token-identical output needs.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from dispatch import runtime  # noqa: F401  (sets TRITON_INTERPRET before triton loads)
from dispatch.config import MoEConfig, MoEWeights
from dispatch.engine.attention import num_splits
from dispatch.kernels import tiles
from dispatch.kernels.dense_gemv import linear_small
from dispatch.kernels.tiles import DecodeConfig

# Under the interpreter: wide tiles (a whole expert of the small CPU model in one item), as few programs
# and interpreted ops as possible. Pinned like any other config, so just as row-invariant.
INTERPRET_DECODE = DecodeConfig(block_m=16, block_i=64, block_h=128, block_ho=128, block_id=64, num_stages=1)


def linear(x_TH: torch.Tensor, w_NH: torch.Tensor, bias_N: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ bias), each row's bits independent of the number of rows (any T)."""
    return linear_small(x_TH, w_NH, bias_N, invariant=True)


@triton.jit
def _silu_mul_kernel(a_ptr, b_ptr, out_ptr, N, s_a, s_b, s_o, GATE: tl.constexpr, BLOCK: tl.constexpr):
    """Row t, columns of tile pid(1): silu(a) · b (GATE 0, a and b [T, N]) or sigmoid(a[t, 0]) · b
    (GATE 1, a [T, 1]), in fp32, rounded once."""
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    b = tl.load(b_ptr + t * s_b + offs, mask=m, other=0.0).to(tl.float32)
    if GATE:
        y = tl.sigmoid(tl.load(a_ptr + t * s_a).to(tl.float32)) * b
    else:
        a = tl.load(a_ptr + t * s_a + offs, mask=m, other=0.0).to(tl.float32)
        y = a * tl.sigmoid(a) * b
    tl.store(out_ptr + t * s_o + offs, y.to(out_ptr.dtype.element_ty), mask=m)


def silu_mul(a_TN: torch.Tensor, b_TN: torch.Tensor, *, gate: bool = False) -> torch.Tensor:
    """silu(a) · b row by row (``gate``: sigmoid(a [T, 1]) · b, a gated shared expert's output),
    fp32 inside, one rounding to b's dtype; each element's bits independent of T."""
    T, N = b_TN.shape
    want = (T, 1) if gate else (T, N)
    if tuple(a_TN.shape) != want or a_TN.dtype != b_TN.dtype or a_TN.device != b_TN.device \
            or (N > 1 and b_TN.stride(1) != 1) or (not gate and N > 1 and a_TN.stride(1) != 1):
        raise ValueError(f"silu_mul needs a {list(want)} and b [T, N] of one dtype and device, last dims "
                         f"contiguous; got {tuple(a_TN.shape)} {a_TN.dtype}, {tuple(b_TN.shape)} {b_TN.dtype}")
    out = torch.empty_like(b_TN, memory_format=torch.contiguous_format)
    if T and N:
        block = min(1024, triton.next_power_of_2(N))
        _silu_mul_kernel[(T, triton.cdiv(N, block))](a_TN, b_TN, out, N, a_TN.stride(0), b_TN.stride(0),
                                                      out.stride(0), GATE=gate, BLOCK=block, num_warps=4)
    return out


def silu_mul_torch(a_TN: torch.Tensor, b_TN: torch.Tensor, *, gate: bool = False) -> torch.Tensor:
    """The twin of :func:`silu_mul` (fp32, one rounding)."""
    a, b = a_TN.float(), b_TN.float()
    return (torch.sigmoid(a) * b if gate else a * torch.sigmoid(a) * b).to(b_TN.dtype)


def attention_splits(S: int, KV: int, device) -> int:
    """Key-range splits of a decode/verify attention over a static cache of S keys: those of a single
    row (B = 1), whatever the rows in the step, so a query's key chunks never change."""
    return num_splits(S, KV, device)


@functools.lru_cache(maxsize=256)
def _decode_tiles(K: int, E: int, H: int, I: int, dtype: torch.dtype, device: str) -> DecodeConfig:  # noqa: E741
    dev = torch.device(device)
    if tiles.interpreting(dev):
        return INTERPRET_DECODE
    cfg = tiles.decode_config(1, K, E, H, I, dtype, dev)  # the table's (or heuristic's) one-token tiles
    if cfg.block_m < 16 or cfg.fused or cfg.split:  # an FMA or one-launch variant: the plain tl.dot tiles
        cfg = tiles.heuristic_decode(1, K, E, H, I, dev)
    return replace(cfg, fused=0, split=0)


def decode_tiles(cfg: MoEConfig, dtype: torch.dtype, device) -> DecodeConfig:
    """The one :class:`DecodeConfig` of a layer's experts in batch-invariant mode, for every T: the
    one-token tiles of the tuned table or the heuristic (tl.dot on 16-row tiles, three launches)."""
    return _decode_tiles(cfg.K, cfg.E, cfg.H, cfg.I, dtype, str(torch.device(device)))


def moe_layer(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor:
    """One MoE layer, row-invariant: router + top-K (one program per token), the routed experts on
    the decode kernels with :func:`decode_tiles`, the shared expert (if any) through :func:`linear`."""
    from dispatch.engine.fused_moe import router_topk
    from dispatch.kernels.gemv import moe_decode

    if cfg.scoring != "softmax" or w.bias_E is not None:
        raise ValueError(f"batch-invariant mode routes softmax families; {cfg.family} scores with {cfg.scoring!r}")
    weights_TK, ids_TK = router_topk(x_TH, w.router_EH, cfg)
    y_TH = moe_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, config=decode_tiles(cfg, x_TH.dtype,
                                                                                               x_TH.device))
    if not cfg.shared_intermediate_size:
        return y_TH
    S = cfg.shared_intermediate_size  # two GEMMs of S, as the reference layer (dispatch.reference.shared_reference)
    gate_up = w.shared_gate_up_2SH
    out_TH = linear(silu_mul(linear(x_TH, gate_up[:S]), linear(x_TH, gate_up[S:])), w.shared_down_HS)
    if cfg.shared_gate:
        out_TH = silu_mul(linear(x_TH, w.shared_gate_1H), out_TH, gate=True)
    return y_TH + out_TH


def dense_mlp(x_TH: torch.Tensor, gate_IH, up_IH, down_HI) -> torch.Tensor:
    """A dense SwiGLU layer (Qwen2-MoE's ``mlp_only_layers``), row-invariant."""
    return linear(silu_mul(linear(x_TH, gate_IH), linear(x_TH, up_IH)), down_HI)
