"""A lean decoder forward over a static KV cache, with weights taken from a transformers model.

Why not drive transformers' own modules? A decode step of ``OlmoeForCausalLM`` is hundreds of small
kernels (mask building, cache bookkeeping, per-projection GEMVs, rotary, norms, casts), and even
captured in a CUDA graph the experts are a small part of its step (chapter 6 profiles both steps
from its recording). This forward does only what the math needs, per layer:

    RMSNorm → one fused QKV GEMV → (q/k norm) → RoPE → write K, V at each row's position
    → SDPA over the static cache (boolean mask: key position ≤ row position) → O proj → residual
    → RMSNorm → MoE (this package's router kernel + experts; + shared expert) → residual

Families: OLMoE (q/k RMSNorm over all heads), Mixtral (none), Qwen3-MoE (per-head q/k norm),
Qwen2-MoE (QKV biases, gated shared expert, dense MLP layers). DeepSeek-V3's latent attention is
not written here: run it through transformers with the ``"dispatch"`` experts backend.

On CUDA the norms, residual adds, q/k norms, RoPE and cache writes run as two fused kernels
(:mod:`dispatch.kernels.norm_rope`); on CPU as their torch twins (transformers' ops, one for one).
With ``decode_kernels`` (default: with ``fused``), a decode step of at most 16 rows runs its
projections (QKV, O, lm_head) through :func:`dispatch.kernels.dense_gemv.linear_small` — a GEMV
that streams the weights at a bandwidth cuBLAS does not reach at one row — and its attention
through :func:`dispatch.kernels.attention.decode_attention` (one launch over the static cache, no
mask tensor); prefill keeps cuBLAS and SDPA. On sm_90+ the step's Triton kernels (these, the glue, the
router GEMV and the decode experts) launch with programmatic dependent launch (:mod:`dispatch.kernels.pdl`):
each one is scheduled while the one before it drains, so their launches and ramp-ups overlap.
With ``fused_moe=True``, an MoE layer at batch 1 whose routing family has the "fused_router" fast
path (:mod:`dispatch.families`: softmax) runs router + top-K as one kernel and the experts as two
(:mod:`dispatch.kernels.fused_moe`). Off by default: its down kernel gives OLMoE's layer half the
programs of the library's three decode launches, too few to keep every SM streaming weights
(chapter 6 counts them).
With ``batch_invariant`` (chapter 9), every decode and verify step runs the kernels of
:mod:`dispatch.engine.invariant`: a row's logits are the same bits whatever the rows in the step.
A non-prefill step may carry S > 1 consecutive tokens per row (a verify step): token s of row b sits
at ``pos_BS[b, s]`` and attends to the keys up to it.
Weights are shared with the transformers model (no copies) except the fused QKV matrix.
Quantized experts (a model passed through ``dispatch.quant.swap_experts``): :mod:`dispatch.engine.quant`.
Cache: ``k_LBSkD`` / ``v_LBSkD`` [L, B, S, kv, D]; rows of a batch may sit at different positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dispatch import activations, families
from dispatch.config import MoEConfig, MoEWeights
from dispatch.engine import invariant as invariant_ops
from dispatch.engine.quant import QuantLayer, quantized_layer
from dispatch.kernels.attention import decode_attention
from dispatch.kernels.dense_gemv import MAX_ROWS, linear_small
from dispatch.kernels.norm_rope import add_rms, add_rms_torch, qk_rope, qk_rope_torch
from dispatch.quant.modules import QuantizedExpertsModule

FAMILIES = ("olmoe", "mixtral", "qwen2_moe", "qwen3_moe")


@dataclass(frozen=True)
class LeanConfig:
    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    eps: float
    qk_norm: str  # "none" | "full" (over all heads, OLMoE) | "head" (per head, Qwen3)
    sliding_window: int | None = None  # attention span, if the family limits it (Mixtral, Qwen)
    activation: str = "silu"  # the MLPs' gated activation (dispatch.activations): the model's hidden_act


class LeanModel(torch.nn.Module):
    """``forward(ids_BS, pos_BS, cache, *, prefill)`` → logits [B, S, V] (the model's dtype)."""

    def __init__(self, cfg: LeanConfig, layers: list[dict], embed, norm, lm_head, inv_freq, rope_scale,
                 moe_cfgs: list[MoEConfig | None], moe_path: str, fused: bool, fused_moe: bool = False,
                 decode_kernels: bool | None = None, batch_invariant: bool = False):
        super().__init__()
        if batch_invariant and any("quant" in d for d in layers):
            raise ValueError("batch_invariant=True covers unquantized experts; this model has quantized layers")
        self.cfg, self.layers, self.moe_cfgs, self.moe_path = cfg, layers, moe_cfgs, moe_path
        self.fused, self.fused_moe = fused or batch_invariant, fused and fused_moe
        self.decode_kernels = fused if decode_kernels is None else decode_kernels
        self.batch_invariant = batch_invariant
        self.embed, self.norm, self.lm_head = embed, norm, lm_head
        self.inv_freq, self.rope_scale = inv_freq, rope_scale

    @classmethod
    def from_hf(cls, model, *, moe_path: str | None = None, fused: bool | None = None,
                fused_moe: bool = False, quantized: dict | None = None,
                decode_kernels: bool | None = None, batch_invariant: bool = False) -> "LeanModel":
        """From an ``*ForCausalLM`` of a family in :data:`FAMILIES` (weights shared, QKV fused).

        ``moe_path``: the :func:`dispatch.moe` path; default "auto" on CUDA (decode kernels for
        few tokens, grouped GEMM above), "torch" on CPU (the interpreter only when asked).
        ``fused``: the glue kernels of :mod:`dispatch.kernels.norm_rope` (default: on CUDA), else torch ops.
        ``fused_moe``: at batch 1, :mod:`dispatch.kernels.fused_moe` (needs ``fused``; off: slower).
        ``decode_kernels``: the decode step's GEMV and attention kernels (default: as ``fused``).
        ``quantized``: {layer index: QuantizedExperts} (``dispatch.quant.quantize_model``) to run those
        layers' experts on (the transformers model is left as it is).
        ``batch_invariant``: decode and verify steps through :mod:`dispatch.engine.invariant` (implies
        the fused glue; on CPU every kernel runs under Triton's interpreter)."""
        from dispatch.hf import config_from_hf, weights_from_hf

        c = model.config
        if c.model_type not in FAMILIES:
            raise ValueError(f"the lean forward covers {FAMILIES}, got {c.model_type!r}; "
                             "run it through transformers with the 'dispatch' experts backend")
        if moe_path is None:
            moe_path = "torch" if model.device.type == "cpu" else "auto"
        if fused is None:
            fused = model.device.type == "cuda"
        base = model.model
        rope = base.rotary_emb
        if getattr(rope, "rope_type", "default") not in ("default", "linear"):
            raise ValueError(f"rope_type {rope.rope_type!r} is not supported by the lean forward")
        heads, kv = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        qk = {"olmoe": "full", "qwen3_moe": "head"}.get(c.model_type, "none")
        window = getattr(c, "sliding_window", None)
        if c.model_type != "mixtral" and not getattr(c, "use_sliding_window", False):
            window = None
        act = activations.from_hf(getattr(c, "hidden_act", "silu")).name
        cfg = LeanConfig(c.model_type, c.num_hidden_layers, c.hidden_size, heads, kv, head_dim, c.vocab_size,
                         float(c.rms_norm_eps), qk, window, act)
        layers, moe_cfgs, quantized = [], [], dict(quantized or {})
        with torch.no_grad():
            for idx, layer in enumerate(base.layers):
                a = layer.self_attn
                d = {"in_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
                     "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                     "o": a.o_proj.weight}
                if a.q_proj.bias is not None:
                    d["qkv_bias"] = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                if qk != "none":
                    d["q_norm"], d["k_norm"] = a.q_norm.weight, a.k_norm.weight
                mlp = layer.mlp
                experts = getattr(mlp, "experts", None)
                if isinstance(experts, QuantizedExpertsModule) or idx in quantized:  # dispatch.quant's codes
                    mc = config_from_hf(c)
                    qe, w8a8 = (quantized.pop(idx), False) if idx in quantized else (experts.quantized, experts.w8a8)
                    d["quant"] = QuantLayer(mc, quantized_layer(mlp, mc, qe), qe, w8a8)
                    moe_cfgs.append(mc)
                elif hasattr(experts, "gate_up_proj"):
                    mc = config_from_hf(c)
                    d["moe"] = weights_from_hf(mlp, mc)
                    moe_cfgs.append(mc)
                else:  # a dense SwiGLU layer (Qwen2-MoE's mlp_only_layers)
                    d["mlp"] = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
                    moe_cfgs.append(None)
                layers.append(d)
        if quantized:
            raise ValueError(f"quantized layers {sorted(quantized)} are not MoE layers of this model")
        return cls(cfg, layers, base.embed_tokens.weight, base.norm.weight, model.lm_head.weight,
                   rope.inv_freq.float().contiguous(), float(getattr(rope, "attention_scaling", 1.0)), moe_cfgs,
                   moe_path, fused, fused_moe, decode_kernels, batch_invariant)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def with_batch_invariance(self, on: bool = True) -> "LeanModel":
        """This model (``on`` already its mode) or a copy in the other mode, sharing every weight."""
        if on == self.batch_invariant:
            return self
        c = self
        return LeanModel(c.cfg, c.layers, c.embed, c.norm, c.lm_head, c.inv_freq, c.rope_scale, c.moe_cfgs,
                         c.moe_path, c.fused, c.fused_moe, c.decode_kernels, on)

    def new_cache(self, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed K and V caches [L, B, S, kv, D] in the model's dtype and device."""
        c = self.cfg
        shape = (c.num_layers, batch, seq, c.num_kv_heads, c.head_dim)
        return (torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device))

    def _mlp(self, i: int, x_TH, invariant: bool = False):
        d = self.layers[i]
        if invariant:
            return invariant_ops.dense_mlp(x_TH, *d["mlp"], self.cfg.activation) if "mlp" in d else \
                invariant_ops.moe_layer(x_TH, self.moe_cfgs[i], d["moe"])
        if "quant" in d:
            return d["quant"](x_TH, self.moe_path)
        if "mlp" in d:
            g, u, dn = d["mlp"]
            return F.linear(activations.gated(F.linear(x_TH, g), F.linear(x_TH, u), self.cfg.activation), dn)
        cfg, w = self.moe_cfgs[i], d["moe"]
        fused = "fused_router" in families.get(cfg.scoring).fast_paths  # its family has the batch-1 router
        if self.fused_moe and self.moe_path in ("auto", "decode") and x_TH.shape[0] == 1 and fused:
            from dispatch.kernels.fused_moe import moe_decode_1, router_topk
            from dispatch.reference import shared_reference

            weights_TK, ids_TK = router_topk(x_TH, w.router_EH, cfg)  # batch 1: 3 launches, not 5
            y_TH = moe_decode_1(x_TH, weights_TK, ids_TK, w.gate_up_E2IH, w.down_EHI, activation=cfg.activation)
            shared_TH = shared_reference(x_TH, cfg, w)
            return y_TH if shared_TH is None else y_TH + shared_TH
        from dispatch.moe import moe

        return moe(x_TH, cfg, w, path=self.moe_path)

    def forward(self, ids_BS: torch.Tensor, pos_BS: torch.Tensor, cache, *, prefill: bool) -> torch.Tensor:
        """Logits [B, S, V]. ``prefill``: the cache is empty and ``pos_BS`` is 0..S-1 in every row
        (causal attention over the S new tokens, K/V stored at 0..S-1); else token s of row b
        stores at, and attends to positions ≤, ``pos_BS[b, s]`` (S = 1: a decode step; S = k+1
        consecutive positions: a verify step)."""
        c = self.cfg
        B, S = ids_BS.shape
        add_norm, qk = (add_rms, qk_rope) if self.fused else (add_rms_torch, qk_rope_torch)
        inv = self.batch_invariant and not prefill
        small = (self.decode_kernels or inv) and not prefill  # the decode step's own kernels
        lin = invariant_ops.linear if inv else linear_small if small and B * S <= MAX_ROWS else F.linear
        splits = invariant_ops.attention_splits(k_cache_len(cache), c.num_kv_heads, self.device) if inv else None
        k_cache, v_cache = cache
        x = F.embedding(ids_BS.reshape(-1), self.embed)  # the residual stream [T, H], updated in place
        pos_T = pos_BS.reshape(-1)
        gqa = c.num_kv_heads != c.num_heads
        if not prefill and not small:
            keys = torch.arange(k_cache.shape[2], device=x.device)
            mask = (keys[None, None, :] <= pos_BS[:, :, None])[:, None]  # [B, 1, S, S_cache]
        delta = None
        for i, d in enumerate(self.layers):
            h = add_norm(x, delta, d["in_norm"], c.eps)
            qkv = lin(h, d["qkv"], d.get("qkv_bias"))
            q = qk(qkv, pos_T, S, d.get("q_norm"), d.get("k_norm"), c.qk_norm, self.inv_freq, self.rope_scale, c.eps,
                   k_cache[i], v_cache[i], c.num_heads)
            if small:  # S new tokens per row, each attends to the row's cache up to its own position
                o = decode_attention(q.view(B * S, c.num_heads, c.head_dim), k_cache[i], v_cache[i], pos_T,
                                     splits=splits, queries_per_row=S)
            else:
                q = q.view(B, S, c.num_heads, c.head_dim).transpose(1, 2)
                k, v = k_cache[i, :B].transpose(1, 2), v_cache[i, :B].transpose(1, 2)
                if prefill:
                    k, v = k[:, :, :S], v[:, :, :S]
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                else:
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
                o = o.transpose(1, 2)
            a = lin(o.reshape(B * S, -1), d["o"])
            h = add_norm(x, a, d["post_norm"], c.eps)
            delta = self._mlp(i, h, inv)
        return lin(add_norm(x, delta, self.norm, c.eps), self.lm_head).view(B, S, -1)


def k_cache_len(cache) -> int:
    """Positions S of a [L, B, S, kv, D] cache pair."""
    return cache[0].shape[2]


def moe_weights(model: LeanModel) -> list[MoEWeights]:
    """The unquantized MoE layers' weights (for byte counting)."""
    return [d["moe"] for d in model.layers if "moe" in d]
