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

    op                                    kernel                                what is fixed
    RMSNorm + residual, q/k norm + RoPE   ``add_rms``, ``qk_rope``              one program per row (as is)
    QKV, O, lm_head, dense MLPs,          ``linear_small(invariant=True)``      tl.dot on 16-row tiles for
      the gated shared expert                                                   every M, one config from (N, K)
    attention                             ``decode_attention``                  key chunks from the cache
                                          (``splits=attention_splits(...)``)     length S and KV, not from B
    router + top-K                        ``router_topk(split=True)``           a program per token and
                                                                                E tile, then one per token
    routed experts + k-order combine      ``moe_decode(config=decode_tiles)``   the decode path at every T,
                                                                                16 rows per tl.dot, no split
    next token                            ``argmax``                            exact (no rounding)

Elementwise ops are invariant on a GPU, but not all of them on a CPU: torch's vectorised SiLU and
sigmoid compute an element in the vector body or in the scalar tail depending on where it sits in
the tensor, and the two round differently. The gated products (SwiGLU or GeGLU) and the shared
expert's gate run in one small kernel here (:func:`silu_mul`: one program per row and column tile,
the same tile shape for every row); additions and products (the residual, the shared expert's sum)
round exactly. Why the kernels above are row-invariant once their tiles are fixed: a ``tl.dot`` output row is computed
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

import torch

from dispatch import families
from dispatch.config import MoEConfig, MoEWeights
from dispatch.kernels import tiles
from dispatch.kernels.attention import num_splits
from dispatch.kernels.dense_gemv import linear_small
from dispatch.kernels.gated_rows import gated_rows, gated_rows_torch
from dispatch.kernels.tiles import DecodeConfig

# Under the interpreter: wide tiles (a whole expert of the small CPU model in one item), as few programs
# and interpreted ops as possible. Pinned like any other config, so just as row-invariant.
INTERPRET_DECODE = tiles.INVARIANT_INTERPRET_DECODE


def linear(x_TH: torch.Tensor, w_NH: torch.Tensor, bias_N: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T (+ bias), each row's bits independent of the number of rows (any T)."""
    return linear_small(x_TH, w_NH, bias_N, invariant=True)


def silu_mul(a_TN: torch.Tensor, b_TN: torch.Tensor, *, gate: bool = False, activation: str = "silu") -> torch.Tensor:
    """act(a) · b row by row (SwiGLU by default; ``activation``: any of :mod:`dispatch.activations`;
    ``gate``: sigmoid(a [T, 1]) · b, a gated shared expert's output), fp32 inside, one rounding to b's
    dtype; each element's bits independent of T (the kernel: :mod:`dispatch.kernels.gated_rows`)."""
    return gated_rows(a_TN, b_TN, activation=activation, gate=gate, what="silu_mul")


def silu_mul_torch(a_TN: torch.Tensor, b_TN: torch.Tensor, *, gate: bool = False,
                   activation: str = "silu") -> torch.Tensor:
    """The twin of :func:`silu_mul` (fp32, one rounding)."""
    return gated_rows_torch(a_TN, b_TN, activation=activation, gate=gate, what="silu_mul_torch")


def attention_splits(S: int, KV: int, device) -> int:
    """Key-range splits of a decode/verify attention over a static cache of S keys: those of a single
    row (B = 1), whatever the rows in the step, so a query's key chunks never change."""
    return num_splits(S, KV, device)


@functools.lru_cache(maxsize=1024)
def _decode_tiles(T: int, K: int, E: int, H: int, I: int, dtype: torch.dtype, device: str) -> DecodeConfig:  # noqa: E741
    return tiles.resolve("decode_invariant", (T, K, E, H, I), dtype, torch.device(device)).config


def decode_tiles(cfg: MoEConfig, dtype: torch.dtype, device, T: int = 1) -> DecodeConfig:
    """A layer's experts tiles in batch-invariant mode for a step of T rows
    (``tiles.resolve("decode_invariant", ...)``): the one-token tiles of the tuned table or the
    heuristic, tl.dot on 16-row tiles (three launches, or their items in one: bitwise the same,
    :mod:`dispatch.kernels.decode_fused`); at T > 1 T's own tiles where they are of the same kind
    (rows per tl.dot, no split sum over I): they change which program computes a tile and the tile's
    width, not the order of any row's sum, which runs over H (or I) in 16-wide MMA steps carried in
    one accumulator whatever the chunk sizes."""
    return _decode_tiles(T, cfg.K, cfg.E, cfg.H, cfg.I, dtype, str(torch.device(device)))


def moe_layer(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor:
    """One MoE layer, row-invariant: router + top-K (per token and E tile, then per token), the routed experts on
    the decode kernels with :func:`decode_tiles`, the shared expert (if any) through :func:`linear`."""
    from dispatch.kernels.fused_moe import router_topk
    from dispatch.kernels.gemv import moe_decode

    if "fused_router" not in families.get(cfg.scoring).fast_paths or w.bias_E is not None:
        raise ValueError("batch-invariant mode routes the families with the 'fused_router' fast path "
                         f"(dispatch.families: softmax); {cfg.family} scores with {cfg.scoring!r}")
    weights_TK, ids_TK = router_topk(x_TH, w.router_EH, cfg, split=True)
    y_TH = moe_decode(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI,
                      config=decode_tiles(cfg, x_TH.dtype, x_TH.device, x_TH.shape[0]), activation=cfg.activation)
    if not cfg.shared_intermediate_size:
        return y_TH
    S = cfg.shared_intermediate_size  # two GEMMs of S, as the reference layer (dispatch.reference.shared_reference)
    gate_up = w.shared_gate_up_2SH
    h_TS = silu_mul(linear(x_TH, gate_up[:S]), linear(x_TH, gate_up[S:]), activation=cfg.activation)
    out_TH = linear(h_TS, w.shared_down_HS)
    if cfg.shared_gate:
        out_TH = silu_mul(linear(x_TH, w.shared_gate_1H), out_TH, gate=True)
    return y_TH + out_TH


def dense_mlp(x_TH: torch.Tensor, gate_IH, up_IH, down_HI, activation: str = "silu") -> torch.Tensor:
    """A dense gated layer (Qwen2-MoE's ``mlp_only_layers``: SwiGLU), row-invariant."""
    return linear(silu_mul(linear(x_TH, gate_IH), linear(x_TH, up_IH), activation=activation), down_HI)
