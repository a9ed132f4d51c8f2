"""One step of a mixed batch through chapter 6's lean model, K/V kept in a paged cache.

A step's T tokens are laid out decode rows first (``B`` sequences, one token each), then prefill
chunks (``C`` sequences, several consecutive prompt tokens each). Per layer, as in
:class:`dispatch.engine.model.LeanModel` (its weights, norms, RoPE and MoE layers, unchanged):

    RMSNorm → QKV → q/k norm, RoPE → the step's K, V into a [T, 2, KV, D] scratch → one scatter into
    the cache at each token's slot → decode rows: :func:`paged_decode_attention`, chunks:
    :func:`paged_prefill_attention` → O proj → RMSNorm → MoE over all T tokens → residual

The MoE layer sees the step's T tokens at once, so :func:`dispatch.moe` picks its experts path from
the step's real token count: the decode kernels below the shape's tuned crossover (a decode-only
step, or one with a short chunk), the grouped GEMM above it (a step that carries a long chunk).
Only the rows whose next token is wanted (``logit_rows_R``) reach the final norm's output and the
lm_head. The cache is ``kv`` [L, NB + 1, BS, 2, KV, D]: block NB is a scratch block that padded
rows of a CUDA graph write into and read from, never handed to a sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dispatch.engine.model import LeanModel
from dispatch.kernels.dense_gemv import MAX_ROWS, linear_small
from dispatch.kernels.norm_rope import _rms_torch, _rotate_half, add_rms, add_rms_torch, qk_rope
from dispatch.kernels.paged_attention import (
    paged_decode_attention,
    paged_decode_attention_torch,
    paged_prefill_attention,
    paged_prefill_attention_torch,
)


@dataclass
class StepBatch:
    """The device tensors of one step (T = B decode rows + the chunks' tokens)."""

    ids_T: torch.Tensor  # [T] token ids
    pos_T: torch.Tensor  # [T] positions
    slot_T: torch.Tensor  # [T] cache slot (block·BS + offset) each token's K/V goes to
    table_BM: torch.Tensor  # [B, M] the decode rows' block tables (B may be 0)
    table_CM: torch.Tensor  # [C, M] the chunks' block tables
    q_start_C: torch.Tensor  # [C] first row of chunk c, counted from row B
    q_len_C: torch.Tensor  # [C]
    ctx_start_C: torch.Tensor  # [C] position of chunk c's first token
    max_q_len: int  # the longest chunk (0 without chunks)
    logit_rows_R: torch.Tensor | None  # [R] rows whose logits are wanted; None: all T

    @property
    def num_decode(self) -> int:
        return self.table_BM.shape[0]


def new_kv_cache(lean: LeanModel, num_blocks: int, block_size: int) -> torch.Tensor:
    """The pool [L, num_blocks + 1, BS, 2, KV, D] in the model's dtype (block num_blocks: scratch)."""
    c = lean.cfg
    return torch.zeros(c.num_layers, num_blocks + 1, block_size, 2, c.num_kv_heads, c.head_dim, dtype=lean.dtype,
                       device=lean.device)


def kv_bytes_per_token(lean: LeanModel) -> int:
    c = lean.cfg
    return c.num_layers * 2 * c.num_kv_heads * c.head_dim * lean.dtype.itemsize


def _rope_torch(lean: LeanModel, d: dict, qkv_TC, pos_T, kv_T2KD) -> torch.Tensor:
    """q/k norm and RoPE as :func:`dispatch.kernels.norm_rope.qk_rope_torch` computes them; K, V into the scratch."""
    c = lean.cfg
    T, NH, NKV, D = qkv_TC.shape[0], c.num_heads, c.num_kv_heads, c.head_dim
    q, k, v = qkv_TC.split([NH * D, NKV * D, NKV * D], dim=-1)
    if c.qk_norm == "full":
        q, k = _rms_torch(q, d["q_norm"], c.eps), _rms_torch(k, d["k_norm"], c.eps)
    q, k, v = q.reshape(T, NH, D), k.reshape(T, NKV, D), v.reshape(T, NKV, D)
    if c.qk_norm == "head":
        q, k = _rms_torch(q, d["q_norm"], c.eps), _rms_torch(k, d["k_norm"], c.eps)
    freqs = pos_T[:, None].float() * lean.inv_freq.to(pos_T.device)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = (emb.cos() * lean.rope_scale).to(q.dtype)[:, None], (emb.sin() * lean.rope_scale).to(q.dtype)[:, None]
    kv_T2KD[:, 0] = k * cos + _rotate_half(k) * sin
    kv_T2KD[:, 1] = v
    return q * cos + _rotate_half(q) * sin


def _rope_fused(lean: LeanModel, d: dict, qkv_TC, pos_T, kv_T2KD) -> torch.Tensor:
    """chapter 6's fused kernel, storing token t's K, V at scratch row t: the scratch is passed as a
    cache [T, S, KV, D] whose position stride is 0, so the kernel's row b = t, any position, lands there."""
    c = lean.cfg
    T, NKV, D = kv_T2KD.shape[0], c.num_kv_heads, c.head_dim
    shape, strides = (T, 1 << 20, NKV, D), (kv_T2KD.stride(0), 0, D, 1)
    k_view = kv_T2KD[:, 0].as_strided(shape, strides)
    v_view = kv_T2KD[:, 1].as_strided(shape, strides)
    return qk_rope(qkv_TC, pos_T, 1, d.get("q_norm"), d.get("k_norm"), c.qk_norm, lean.inv_freq, lean.rope_scale,
                   c.eps, k_view, v_view, c.num_heads)


def paged_forward(lean: LeanModel, batch: StepBatch, kv: torch.Tensor, *, kernels: bool) -> torch.Tensor:
    """Logits [R, V] of one mixed step (R = ``logit_rows_R``'s length, or T). ``kernels``: the Triton
    attention kernels (and the fused glue when the model has it), else their plain-PyTorch twins."""
    c = lean.cfg
    T, B = batch.ids_T.shape[0], batch.num_decode
    decode_only = batch.table_CM.shape[0] == 0
    add_norm = add_rms if lean.fused else add_rms_torch
    rope = _rope_fused if lean.fused else _rope_torch
    small = lean.decode_kernels and decode_only and T <= MAX_ROWS  # chapter 6's decode GEMV
    lin = linear_small if small else F.linear
    dec = paged_decode_attention if kernels else paged_decode_attention_torch
    pre = paged_prefill_attention if kernels else paged_prefill_attention_torch
    x = F.embedding(batch.ids_T, lean.embed)  # the residual stream [T, H], updated in place
    scratch = torch.empty(T, 2, c.num_kv_heads, c.head_dim, dtype=lean.dtype, device=x.device)
    delta = None
    for i, d in enumerate(lean.layers):
        h = add_norm(x, delta, d["in_norm"], c.eps)
        qkv = lin(h, d["qkv"], d.get("qkv_bias"))
        q = rope(lean, d, qkv, batch.pos_T, scratch)  # [T, NH, D]
        layer = kv[i]  # [NB + 1, BS, 2, KV, D]
        layer.view(-1, 2, c.num_kv_heads, c.head_dim).index_copy_(0, batch.slot_T, scratch)
        k_blocks, v_blocks = layer[:, :, 0], layer[:, :, 1]
        parts = []
        if B:
            parts.append(dec(q[:B], k_blocks, v_blocks, batch.table_BM, batch.pos_T[:B]))
        if not decode_only:
            parts.append(pre(q[B:], k_blocks, v_blocks, batch.table_CM, batch.q_start_C, batch.q_len_C,
                             batch.ctx_start_C, max_q_len=batch.max_q_len))
        o = parts[0] if len(parts) == 1 else torch.cat(parts)
        a = lin(o.reshape(T, -1), d["o"])
        h = add_norm(x, a, d["post_norm"], c.eps)
        delta = lean._mlp(i, h)  # dispatch.moe over the step's T tokens
    if batch.logit_rows_R is not None:
        x, delta = x[batch.logit_rows_R], delta[batch.logit_rows_R]
    out = add_norm(x.contiguous(), delta.contiguous(), lean.norm, c.eps)
    return (linear_small if small else F.linear)(out, lean.lm_head)
