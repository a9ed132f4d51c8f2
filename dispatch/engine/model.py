"""A lean decoder forward over a static KV cache, with weights taken from a transformers model.

Why not drive transformers' own modules? A decode step of ``OlmoeForCausalLM`` is hundreds of small
kernels (mask building, cache bookkeeping, per-projection GEMVs, rotary, norms, casts); captured
in a CUDA graph it still runs ~3.5 ms at batch 1, of which the experts are ~0.6 ms. This forward
does only what the math needs, per layer:

    RMSNorm → one fused QKV GEMV → (q/k norm) → RoPE → write K, V at each row's position
    → SDPA over the static cache (boolean mask: key position ≤ row position) → O proj → residual
    → RMSNorm → MoE (this package's router kernel + experts; + shared expert) → residual

Families: OLMoE (q/k RMSNorm over all heads), Mixtral (none), Qwen3-MoE (per-head q/k norm),
Qwen2-MoE (QKV biases, gated shared expert, dense MLP layers). DeepSeek-V3's latent attention is
not written here: run it through transformers with the ``"dispatch"`` experts backend.

Weights are shared with the transformers model (no copies) except the fused QKV matrix.
Cache: ``k_LBSkD`` / ``v_LBSkD`` [L, B, S, kv, D]; rows of a batch may sit at different positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dispatch.config import MoEConfig, MoEWeights

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


def _rms(x, w, eps):
    """transformers' RMSNorm, op for op (fp32 statistics, cast back, then the weight)."""
    dt = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return w * x.to(dt)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LeanModel(torch.nn.Module):
    """``forward(ids_BS, pos_BS, cache, *, prefill)`` → logits [B, S, V] (the model's dtype)."""

    def __init__(self, cfg: LeanConfig, layers: list[dict], embed, norm, lm_head, inv_freq, rope_scale,
                 moe_cfgs: list[MoEConfig | None], moe_path: str):
        super().__init__()
        self.cfg, self.layers, self.moe_cfgs, self.moe_path = cfg, layers, moe_cfgs, moe_path
        self.embed, self.norm, self.lm_head = embed, norm, lm_head
        self.inv_freq, self.rope_scale = inv_freq, rope_scale

    @classmethod
    def from_hf(cls, model, *, moe_path: str | None = None) -> "LeanModel":
        """From an ``*ForCausalLM`` of a family in :data:`FAMILIES` (weights shared, QKV fused).

        ``moe_path``: the :func:`dispatch.moe` path; default "auto" on CUDA (decode kernels for
        few tokens, grouped GEMM above), "torch" on CPU (the interpreter only when asked)."""
        from dispatch.hf import config_from_hf, weights_from_hf

        c = model.config
        if c.model_type not in FAMILIES:
            raise ValueError(f"the lean forward covers {FAMILIES}, got {c.model_type!r}; "
                             "run it through transformers with the 'dispatch' experts backend")
        if moe_path is None:
            moe_path = "torch" if model.device.type == "cpu" else "auto"
        base = model.model
        rope = base.rotary_emb
        if getattr(rope, "rope_type", "default") not in ("default", "linear"):
            raise ValueError(f"rope_type {rope.rope_type!r} is not supported by the lean forward")
        heads, kv = c.num_attention_heads, c.num_key_value_heads or c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
        qk = {"olmoe": "full", "qwen3_moe": "head"}.get(c.model_type, "none")
        cfg = LeanConfig(c.model_type, c.num_hidden_layers, c.hidden_size, heads, kv, head_dim, c.vocab_size,
                         float(c.rms_norm_eps), qk)
        layers, moe_cfgs = [], []
        with torch.no_grad():
            for layer in base.layers:
                a = layer.self_attn
                d = {"in_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
                     "qkv": torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).contiguous(),
                     "o": a.o_proj.weight}
                if a.q_proj.bias is not None:
                    d["qkv_bias"] = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias])
                if qk != "none":
                    d["q_norm"], d["k_norm"] = a.q_norm.weight, a.k_norm.weight
                mlp = layer.mlp
                if hasattr(getattr(mlp, "experts", None), "gate_up_proj"):
                    mc = config_from_hf(c)
                    d["moe"] = weights_from_hf(mlp, mc)
                    moe_cfgs.append(mc)
                else:  # a dense SwiGLU layer (Qwen2-MoE's mlp_only_layers)
                    d["mlp"] = (mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight)
                    moe_cfgs.append(None)
                layers.append(d)
        return cls(cfg, layers, base.embed_tokens.weight, base.norm.weight, model.lm_head.weight,
                   rope.inv_freq.float(), float(getattr(rope, "attention_scaling", 1.0)), moe_cfgs, moe_path)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def new_cache(self, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zeroed K and V caches [L, B, S, kv, D] in the model's dtype and device."""
        c = self.cfg
        shape = (c.num_layers, batch, seq, c.num_kv_heads, c.head_dim)
        return (torch.zeros(shape, dtype=self.dtype, device=self.device),
                torch.zeros(shape, dtype=self.dtype, device=self.device))

    def _rope(self, pos_BS, dt):
        freqs = pos_BS[..., None].float() * self.inv_freq.to(pos_BS.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dt)[:, :, None], (emb.sin() * self.rope_scale).to(dt)[:, :, None]

    def _mlp(self, i: int, x_TH):
        d = self.layers[i]
        if "mlp" in d:
            g, u, dn = d["mlp"]
            return F.linear(F.silu(F.linear(x_TH, g)) * F.linear(x_TH, u), dn)
        from dispatch.moe import moe

        return moe(x_TH, self.moe_cfgs[i], d["moe"], path=self.moe_path)

    def forward(self, ids_BS: torch.Tensor, pos_BS: torch.Tensor, cache, *, prefill: bool) -> torch.Tensor:
        """Logits [B, S, V]. ``prefill``: the cache is empty and ``pos_BS`` is 0..S-1 in every row
        (causal attention over the S new tokens, K/V stored at 0..S-1); else S = 1 and row b
        stores at, and attends to positions ≤, ``pos_BS[b, 0]``."""
        c = self.cfg
        B, S = ids_BS.shape
        k_cache, v_cache = cache
        x = F.embedding(ids_BS, self.embed)
        cos, sin = self._rope(pos_BS, x.dtype)
        nq, nk = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        if not prefill:
            rows_B = torch.arange(B, device=x.device)
            keys = torch.arange(k_cache.shape[2], device=x.device)
            mask = (keys[None, :] <= pos_BS[:, :1])[:, None, None, :]  # [B, 1, 1, S_cache]
        for i, d in enumerate(self.layers):
            h = _rms(x, d["in_norm"], c.eps)
            qkv = F.linear(h, d["qkv"], d.get("qkv_bias"))
            q, k, v = qkv.split([nq, nk, nk], dim=-1)
            if c.qk_norm == "full":
                q, k = _rms(q, d["q_norm"], c.eps), _rms(k, d["k_norm"], c.eps)
            q = q.view(B, S, c.num_heads, c.head_dim)
            k = k.view(B, S, c.num_kv_heads, c.head_dim)
            v = v.view(B, S, c.num_kv_heads, c.head_dim)
            if c.qk_norm == "head":
                q, k = _rms(q, d["q_norm"], c.eps), _rms(k, d["k_norm"], c.eps)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            if prefill:
                k_cache[i, :B, :S] = k
                v_cache[i, :B, :S] = v
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True, enable_gqa=c.num_kv_heads != c.num_heads)
            else:
                k_cache[i, rows_B, pos_BS[:, 0]] = k[:, 0]
                v_cache[i, rows_B, pos_BS[:, 0]] = v[:, 0]
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k_cache[i, :B].transpose(1, 2),
                                                   v_cache[i, :B].transpose(1, 2), attn_mask=mask,
                                                   enable_gqa=c.num_kv_heads != c.num_heads)
            x = x + F.linear(o.transpose(1, 2).reshape(B, S, nq), d["o"])
            h = _rms(x, d["post_norm"], c.eps)
            x = x + self._mlp(i, h.view(B * S, -1)).view(B, S, -1)
        return F.linear(_rms(x, self.norm, c.eps), self.lm_head)


def moe_weights(model: LeanModel) -> list[MoEWeights]:
    """The MoE layers' weights (for byte counting)."""
    return [d["moe"] for d in model.layers if "moe" in d]
