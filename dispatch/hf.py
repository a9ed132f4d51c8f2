"""The bridge to transformers: MoEConfig from a transformers config, MoEWeights from its MoE blocks.

Supported model types: those of the routing families' table (:mod:`dispatch.families`, each type's
``HFMapping``: its block class and its config's fields; transformers 5 attribute names, checked
against 5.17 and 5.24), e.g.

    model_type    block class              I from                 E from
    olmoe         OlmoeSparseMoeBlock      intermediate_size      num_experts
    mixtral       MixtralSparseMoeBlock    intermediate_size      num_local_experts
    qwen2_moe     Qwen2MoeSparseMoeBlock   moe_intermediate_size  num_experts   (+ gated shared expert)
    qwen3_moe     Qwen3MoeSparseMoeBlock   moe_intermediate_size  num_experts
    deepseek_v3   DeepseekV3MoE            moe_intermediate_size  n_routed_experts (+ shared experts)

transformers 5 stores a block's experts fused (``experts.gate_up_proj [E, 2I, H]``,
``experts.down_proj [E, H, I]``) — the layout of :class:`MoEWeights`, so routed experts are shared,
not copied. The shared-expert MLPs are three ``nn.Linear``; their gate and up weights are
concatenated into ``shared_gate_up_2SH`` (a copy).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Iterator

import torch

from dispatch import activations, families
from dispatch.arithmetic import ModelShape
from dispatch.config import MoEConfig, MoEWeights
from dispatch.reference import moe_reference, route_reference, router_logits

SUPPORTED = families.model_types()
BLOCK_CLASSES = {t: families.for_model_type(t)[1].block for t in SUPPORTED}

# allenai/OLMoE-1B-7B-0924, config.json as published on the Hugging Face Hub (Muennighoff et al.,
# "OLMoE: Open Mixture-of-Experts Language Models", 2024). Embedded so chapter 0's arithmetic runs
# offline; `hub_config(name, source="hub")` fetches the live file instead.
OLMOE_1B_7B = {
    "model_type": "olmoe", "hidden_size": 2048, "intermediate_size": 1024, "num_experts": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_attention_heads": 16,
    "num_key_value_heads": 16, "vocab_size": 50304, "max_position_embeddings": 4096,
    "hidden_act": "silu", "norm_topk_prob": False, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "clip_qkv": None, "router_aux_loss_coef": 0.01, "rope_theta": 10000.0,
    "pad_token_id": 1, "eos_token_id": 50279,
}
EMBEDDED = {"allenai/OLMoE-1B-7B-0924": OLMOE_1B_7B}


def hub_config(name: str, source: str = "auto"):
    """A transformers config by hub name: ``source`` 'embedded' | 'hub' | 'auto' (embedded if known).

    'embedded' needs no internet (see :data:`EMBEDDED`); 'hub' calls ``AutoConfig.from_pretrained``.
    """
    from transformers import AutoConfig  # deferred: transformers is heavy and optional for the library

    if source not in ("auto", "embedded", "hub"):
        raise ValueError(f"source must be 'auto', 'embedded' or 'hub', got {source!r}")
    if source == "hub" or (source == "auto" and name not in EMBEDDED):
        return AutoConfig.from_pretrained(name)
    if name not in EMBEDDED:
        raise ValueError(f"no embedded config for {name!r}; embedded: {sorted(EMBEDDED)}")
    values = dict(EMBEDDED[name])
    return AutoConfig.for_model(values.pop("model_type"), **values)


def config_from_hf(hf_config) -> MoEConfig:
    """The :class:`MoEConfig` of one MoE layer of a transformers model config (``model.config``, or
    the dict of a config.json)."""
    if isinstance(hf_config, MoEConfig):
        raise ValueError("expected a transformers config (model.config), got a dispatch.MoEConfig: with one, "
                         "build the layer as MoELayer(cfg, weights_from_hf(block, cfg))")
    if isinstance(hf_config, dict):
        hf_config = SimpleNamespace(**hf_config)
    kind = getattr(hf_config, "model_type", None)
    if kind not in SUPPORTED:
        what = "no model_type" if kind is None else f"model_type {kind!r}"
        raise ValueError(f"model_type must be one of {SUPPORTED}: expected a transformers config of one, got "
                         f"{type(hf_config).__name__} with {what}")
    _, mapping = families.for_model_type(kind)
    act = activations.from_hf(getattr(hf_config, "hidden_act", "silu"))  # SwiGLU or GeGLU, else a ValueError
    try:
        return MoEConfig(**mapping.config(hf_config), family=kind, activation=act.name)
    except AttributeError as e:
        raise ValueError(f"the {kind} config has no {e.name!r} (expected a whole transformers config: model.config, "
                         "AutoConfig.from_pretrained(...), or the dict of its config.json)") from None


def _mlp_gate_up_down(mlp) -> tuple[torch.Tensor, torch.Tensor]:
    """A transformers SwiGLU MLP (gate_proj, up_proj, down_proj) → (gate_up_2SH, down_HS)."""
    return torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0).detach(), mlp.down_proj.weight.detach()


def _check_block_matches(block, cfg: MoEConfig) -> None:
    """Raise ValueError if ``block`` is another family's block, or its router disagrees with ``cfg``."""
    kind = type(block).__name__
    want = BLOCK_CLASSES.get(cfg.family)
    if want is not None and kind in BLOCK_CLASSES.values() and kind != want:
        raise ValueError(f"the config is {cfg.family!r} (a {want}) but the block is a {kind}")
    gate = block.gate
    router = {"top_k": cfg.top_k, "num_experts": cfg.num_experts, "norm_topk_prob": cfg.norm_topk_prob,
              "routed_scaling_factor": cfg.routed_scaling_factor, "num_group": cfg.n_group,
              "topk_group": cfg.topk_group}
    for name, value in router.items():
        have = getattr(gate, name, None)
        if have is not None and not isinstance(have, torch.Tensor) and have != value:
            raise ValueError(f"the block's router has {name}={have!r} but the config says {value!r}")
    shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
    if shared is not None and not cfg.shared_intermediate_size:
        raise ValueError(f"{kind} has a shared expert but the config has none (shared_intermediate_size=0)")
    if hasattr(block, "shared_expert_gate") != cfg.shared_gate:
        raise ValueError(f"the config says shared_gate={cfg.shared_gate} but {kind} "
                         f"{'has' if hasattr(block, 'shared_expert_gate') else 'has no'} shared_expert_gate")


def _experts_layout(experts, cfg: MoEConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate_up_E2IH, down_EHI) of a fused experts module, read by the layout transformers records on
    it: ``is_transposed`` experts store [E, H, 2I] and [E, I, H] (shapes alone cannot tell when 2I = H:
    the weights would be read transposed and the output silently wrong), so they are transposed
    back; interleaved gate/up, biases or gate-less experts are refused. The module's own sizes
    (``hidden_dim``, ``intermediate_dim``) must be the config's."""
    name = type(experts).__name__
    for attr, ok, why in (("is_concatenated", True, "gate and up interleaved row by row"),
                          ("has_bias", False, "expert biases"), ("has_gate", True, "experts without a gate")):
        if getattr(experts, attr, ok) != ok:
            raise ValueError(f"{name} has {attr}={not ok} ({why}): the reference experts are bias-free "
                             "SwiGLU with gate and up stacked")
    for attr, want in (("hidden_dim", cfg.H), ("intermediate_dim", cfg.I)):
        have = getattr(experts, attr, None)
        if isinstance(have, int) and have != want:
            raise ValueError(f"{name}.{attr} is {have} but the config says {want}")
    gu, dn = experts.gate_up_proj.detach(), experts.down_proj.detach()
    if getattr(experts, "is_transposed", False) is True:
        gu, dn = gu.transpose(1, 2), dn.transpose(1, 2)
    return gu, dn


def weights_from_hf(block, cfg: MoEConfig) -> MoEWeights:
    """The :class:`MoEWeights` of a transformers sparse MoE block (see the table above), validated:
    a block of another family, or whose router or tensors disagree with ``cfg``, is a ValueError.
    Transposed expert storage (``experts.is_transposed``) is read as such."""
    experts, gate = getattr(block, "experts", None), getattr(block, "gate", None)
    if experts is None or gate is None or not hasattr(experts, "gate_up_proj"):
        raise ValueError(f"expected a transformers 5 sparse MoE block with .gate and fused .experts, "
                         f"got {type(block).__name__}")
    _check_block_matches(block, cfg)
    gate_up_E2IH, down_EHI = _experts_layout(experts, cfg)
    w = MoEWeights(router_EH=gate.weight.detach(), gate_up_E2IH=gate_up_E2IH, down_EHI=down_EHI)
    if cfg.correction_bias:
        w.bias_E = gate.e_score_correction_bias.detach()
    if cfg.shared_intermediate_size:
        shared = getattr(block, "shared_experts", None) or getattr(block, "shared_expert", None)
        if shared is None:
            raise ValueError(f"the config asks for a shared expert but {type(block).__name__} has none")
        w.shared_gate_up_2SH, w.shared_down_HS = _mlp_gate_up_down(shared)
    if cfg.shared_gate:
        w.shared_gate_1H = block.shared_expert_gate.weight.detach()
    w.validate(cfg)
    return w


def moe_blocks(model) -> Iterator[tuple[int, torch.nn.Module]]:
    """Yield (layer_idx, block) for each decoder layer whose MLP is a sparse MoE block.

    Dense layers (DeepSeek-V3's first ``first_k_dense_replace``, Qwen2-MoE's ``mlp_only_layers``)
    are skipped. Works on ``*ForCausalLM`` and on the bare ``*Model``.
    """
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"expected a transformers decoder with .layers (or .model.layers), got {type(model).__name__}")
    for idx, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "gate") and hasattr(getattr(mlp, "experts", None), "gate_up_proj"):
            yield idx, mlp


def model_shape_from_hf(hf_config):
    """The :class:`dispatch.arithmetic.ModelShape` (layers, vocab, attention sizes) of a config.

    Exact parameter counts for olmoe, mixtral, qwen2_moe, qwen3_moe (tests check them against
    transformers models built on the meta device). DeepSeek-V3's latent attention (MLA) is not
    modelled: a ValueError says so.
    """
    c, moe = hf_config, config_from_hf(hf_config)
    if moe.family == "deepseek_v3":
        raise ValueError("model_shape_from_hf models GQA attention; DeepSeek-V3's MLA is not supported")
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    q, k = heads * head_dim, kv * head_dim
    extra = {"olmoe": q + k,  # q_norm / k_norm over all heads
             "qwen3_moe": 2 * head_dim,  # per-head q_norm / k_norm
             "qwen2_moe": q + 2 * k,  # q, k, v biases
             "mixtral": 0}[moe.family]
    dense = 0
    if moe.family in ("qwen2_moe", "qwen3_moe"):
        dense = sum(1 for i in range(c.num_hidden_layers)
                    if i in (c.mlp_only_layers or []) or (i + 1) % c.decoder_sparse_step)
    return ModelShape(moe=moe, num_layers=c.num_hidden_layers, vocab_size=c.vocab_size, num_heads=heads,
                      num_kv_heads=kv, head_dim=head_dim, tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                      attention_extra_params=extra, dense_layers=dense,
                      dense_intermediate_size=c.intermediate_size if dense else 0)


# Tiny random models of each family (no download): CPU-sized, for tests and chapter 0.
TINY_COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   vocab_size=128, max_position_embeddings=64, pad_token_id=None, bos_token_id=None,
                   eos_token_id=None)
TINY_FAMILIES = {
    "olmoe": dict(intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "mixtral": dict(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2),
    "qwen2_moe": dict(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True),
    "qwen3_moe": dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                      norm_topk_prob=True, head_dim=16),
    "deepseek_v3": dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=16, num_experts_per_tok=4,
                        n_group=4, topk_group=2, n_shared_experts=2, first_k_dense_replace=1, q_lora_rank=32,
                        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        routed_scaling_factor=2.5),
}


def tiny_model(family: str, *, seed: int = 0, experts_implementation: str = "eager", **overrides):
    """(hf_config, model): a tiny random ``*ForCausalLM`` of ``family``, in eval mode.

    ``experts_implementation='eager'`` is the per-expert loop the reference mirrors (transformers 5
    would otherwise pick ``grouped_mm``). DeepSeek-V3's selection bias is zero at init: it is set
    to N(0, 0.1) here so that it matters.
    """
    from transformers import AutoConfig, AutoModelForCausalLM  # deferred: heavy, optional for the library

    if family not in TINY_FAMILIES:
        raise ValueError(f"family must be one of {sorted(TINY_FAMILIES)}, got {family!r}")
    hf_config = AutoConfig.for_model(family, **{**TINY_COMMON, **TINY_FAMILIES[family], **overrides})
    hf_config._experts_implementation = experts_implementation
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config).eval()
    for _, block in moe_blocks(model):
        if hasattr(block.gate, "e_score_correction_bias"):
            with torch.no_grad():
                block.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return hf_config, model


def check_block(block, hf_config, x_TH: torch.Tensor) -> dict[str, str]:
    """Compare the reference layer with a transformers block on x_TH [T, H]: part → verdict.

    Verdicts: 'bit-exact'; 'same set' (ids equal per token up to order: DeepSeek-V3 takes
    ``topk(sorted=False)``); 'within 4 ulp' (relative to the largest entry); 'DIFFERENT'.
    """
    cfg = config_from_hf(hf_config)
    weights = weights_from_hf(block, cfg)
    with torch.no_grad():
        logits_hf, w_hf, ids_hf = block.gate(x_TH)
        logits = router_logits(x_TH, cfg, weights)
        w, ids = route_reference(logits, cfg, weights.bias_E)
        y_hf, y = block(x_TH[None])[0], moe_reference(x_TH, cfg, weights)
    eps = torch.finfo(y.dtype).eps

    def verdict(a, b):
        if torch.equal(a, b):
            return "bit-exact"
        return "within 4 ulp" if (a - b).abs().max() <= 4 * eps * b.abs().max() else "DIFFERENT"

    same_set = torch.equal(ids.sort(-1)[0], ids_hf.sort(-1)[0])
    by_id = verdict(w.to(w_hf.dtype).gather(1, ids.argsort(-1)), w_hf.gather(1, ids_hf.argsort(-1)))
    return {"router logits": verdict(logits, logits_hf),
            "expert ids": "bit-exact" if torch.equal(ids, ids_hf) else "same set" if same_set else "DIFFERENT",
            "weights": verdict(w.to(w_hf.dtype), w_hf) if torch.equal(ids, ids_hf) else by_id + " (by id)",
            "output": verdict(y, y_hf)}
