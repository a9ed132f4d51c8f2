"""Routing families: how a router's logits become each token's K experts and weights, one entry each.

``MoEConfig.scoring`` names the family; everything that depends on it reads this table — the
reference (:func:`dispatch.reference.route_reference` calls the entry's ``reference``), the routing
kernel (its ``MODE`` constexpr is the entry's ``mode``), the fast paths that apply, and the
transformers mapping (:func:`dispatch.hf.config_from_hf`). An unknown name is a ValueError anywhere.

    name           weights, ids of a token                                         transformers
    softmax        p = softmax(logits); top-K of p; w = p (÷ Σ w: norm_topk_prob)   OLMoE, Mixtral,
                                                                                   Qwen2/3-MoE
    sigmoid        s = sigmoid(logits); top-K of s + bias_E (group-limited);       DeepSeek-V3
                   w = s (÷ Σ w), × routed_scaling_factor
    topk_softmax   top-K of the logits; w = softmax of those K (sums to one: no    Cohere2-MoE
                   renormalisation)

Adding a family is one entry here (its reference function, the next ``mode``, its fast paths and
transformers model types) plus its branch in the routing kernel (``dispatch/kernels/routing.py``).

Fast paths (which the layer, the engine and the kernels take only where the family lists them):
    "router_gemv"    the router's logits by the decode step's GEMV (``dense_gemv.linear_small``) in
                     x's dtype, at <= 16 rows on a GPU; families that score fp32 logits never take it
    "fused_router"   the engine's batch-1 router: logits, softmax and top-K in one kernel
                     (``kernels/fused_moe.router_topk``)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

FAST_PATHS = ("router_gemv", "fused_router")


@dataclass(frozen=True)
class HFMapping:
    """How one transformers model type maps onto a :class:`dispatch.config.MoEConfig`: its sparse MoE
    block's class name and a function from the model's config to MoEConfig's keyword arguments."""

    block: str
    config: Callable[[object], dict]


@dataclass(frozen=True)
class RoutingFamily:
    """One way of routing. ``mode``: the routing kernel's constexpr; ``fp32_logits``: the router matmul
    runs in fp32 (as transformers does for it); ``correction_bias`` / ``groups``: whether a selection
    bias and group-limited selection (n_group > 1) may be configured; ``renorm``: whether
    ``norm_topk_prob`` renormalises (False: the weights already sum to one, the flag is not read)."""

    name: str
    mode: int
    reference: Callable  # (logits_TE, cfg, bias_E) → (weights_TK fp32, ids_TK int64), k = 0 first
    fp32_logits: bool = False
    correction_bias: bool = False
    groups: bool = False
    renorm: bool = True
    fast_paths: frozenset = frozenset()
    hf: dict = field(default_factory=dict)  # transformers model_type → HFMapping

    def __post_init__(self):
        unknown = set(self.fast_paths) - set(FAST_PATHS)
        if unknown:
            raise ValueError(f"RoutingFamily {self.name!r}: unknown fast paths {sorted(unknown)}; known {FAST_PATHS}")


def _scaled(weights_TK: torch.Tensor, cfg) -> torch.Tensor:
    return weights_TK * cfg.routed_scaling_factor if cfg.routed_scaling_factor != 1.0 else weights_TK


def softmax_reference(logits_TE: torch.Tensor, cfg, bias_E=None):
    """p = softmax(logits) in fp32, top-K of p, optionally renormalised (transformers' OLMoE, Mixtral, Qwen)."""
    probs_TE = torch.softmax(logits_TE, dim=-1, dtype=torch.float32)
    weights_TK, ids_TK = torch.topk(probs_TE, cfg.top_k, dim=-1)
    if cfg.norm_topk_prob:
        weights_TK = weights_TK / weights_TK.sum(dim=-1, keepdim=True)
    return _scaled(weights_TK, cfg), ids_TK


def sigmoid_reference(logits_TE: torch.Tensor, cfg, bias_E=None):
    """DeepSeek-V3: s = sigmoid(logits); choice scores s + bias_E; the best ``topk_group`` of ``n_group``
    groups (a group scores the sum of its top-2 choice scores) are kept; top-K of the kept choice
    scores; weights are the *unbiased* s of the chosen experts, renormalised if ``norm_topk_prob``,
    times ``routed_scaling_factor``."""
    T, E = logits_TE.shape
    scores_TE = logits_TE.float().sigmoid()
    choice_TE = scores_TE + bias_E.float() if bias_E is not None else scores_TE
    if cfg.n_group > 1:
        G = cfg.n_group
        group_TG = choice_TE.view(T, G, E // G).topk(min(2, E // G), dim=-1)[0].sum(dim=-1)
        keep_TG = torch.zeros_like(group_TG, dtype=torch.bool)
        keep_TG.scatter_(1, torch.topk(group_TG, cfg.topk_group, dim=-1, sorted=False)[1], True)
        keep_TE = keep_TG.unsqueeze(-1).expand(T, G, E // G).reshape(T, E)
        choice_TE = choice_TE.masked_fill(~keep_TE, float("-inf"))
    ids_TK = torch.topk(choice_TE, cfg.top_k, dim=-1)[1]
    weights_TK = scores_TE.gather(1, ids_TK)
    if cfg.norm_topk_prob:
        weights_TK = weights_TK / (weights_TK.sum(dim=-1, keepdim=True) + 1e-20)
    return weights_TK * cfg.routed_scaling_factor, ids_TK


def topk_softmax_reference(logits_TE: torch.Tensor, cfg, bias_E=None):
    """Top-K of the logits, then the softmax of those K in fp32 (transformers' Cohere2-MoE): the same
    experts as ``softmax``, weights that agree with its renormalised ones up to rounding."""
    top_TK, ids_TK = torch.topk(logits_TE.float(), cfg.top_k, dim=-1)
    return _scaled(torch.softmax(top_TK, dim=-1), cfg), ids_TK


# ---- transformers ----

def _softmax_family(c, E: str, I: str, renorm: str | None) -> dict:  # noqa: E741
    """The sizes every softmax model names alike (read first: a config without them is named by them),
    then ``renorm``: the attribute holding norm_topk_prob (None: always renormalised)."""
    out = dict(hidden_size=c.hidden_size, intermediate_size=getattr(c, I), num_experts=getattr(c, E),
               top_k=c.num_experts_per_tok)
    return {**out, "norm_topk_prob": True if renorm is None else bool(getattr(c, renorm))}


def _qwen2_moe(c) -> dict:
    return {**_softmax_family(c, "num_experts", "moe_intermediate_size", "norm_topk_prob"),
            "shared_intermediate_size": c.shared_expert_intermediate_size, "shared_gate": True}


def _deepseek_v3(c) -> dict:
    return dict(hidden_size=c.hidden_size, intermediate_size=c.moe_intermediate_size, num_experts=c.n_routed_experts,
                top_k=c.num_experts_per_tok, scoring="sigmoid", norm_topk_prob=bool(c.norm_topk_prob),
                n_group=c.n_group, topk_group=c.topk_group, routed_scaling_factor=float(c.routed_scaling_factor),
                correction_bias=True, shared_intermediate_size=c.moe_intermediate_size * c.n_shared_experts)


def _cohere2_moe(c) -> dict:
    if c.expert_selection_fn != "softmax":
        raise ValueError(f"cohere2_moe with expert_selection_fn={c.expert_selection_fn!r}: only 'softmax' "
                         "(top-K, then the softmax of those K) is a routing family here")
    if c.num_shared_experts and c.shared_expert_combination_strategy != "sum":
        raise ValueError("cohere2_moe's shared experts combined by "
                         f"{c.shared_expert_combination_strategy!r}: only 'sum' (routed + shared) is supported")
    return dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_experts=c.num_experts,
                top_k=c.num_experts_per_tok, scoring="topk_softmax", norm_topk_prob=bool(c.norm_topk_prob),
                shared_intermediate_size=c.intermediate_size * c.num_shared_experts)  # (renorm: not read)


FAMILIES: dict[str, RoutingFamily] = {f.name: f for f in (
    RoutingFamily("softmax", 0, softmax_reference, fast_paths=frozenset({"router_gemv", "fused_router"}), hf={
        "olmoe": HFMapping("OlmoeSparseMoeBlock", lambda c: _softmax_family(
            c, "num_experts", "intermediate_size", "norm_topk_prob")),
        "mixtral": HFMapping("MixtralSparseMoeBlock", lambda c: _softmax_family(  # its router always renormalises
            c, "num_local_experts", "intermediate_size", None)),
        "qwen2_moe": HFMapping("Qwen2MoeSparseMoeBlock", _qwen2_moe),
        "qwen3_moe": HFMapping("Qwen3MoeSparseMoeBlock", lambda c: _softmax_family(
            c, "num_experts", "moe_intermediate_size", "norm_topk_prob"))}),
    RoutingFamily("sigmoid", 1, sigmoid_reference, fp32_logits=True, correction_bias=True, groups=True, hf={
        "deepseek_v3": HFMapping("DeepseekV3MoE", _deepseek_v3)}),
    RoutingFamily("topk_softmax", 2, topk_softmax_reference, renorm=False,
                  fast_paths=frozenset({"router_gemv"}), hf={
                      "cohere2_moe": HFMapping("Cohere2MoeSparseMoeBlock", _cohere2_moe)}),
)}


def get(name: str) -> RoutingFamily:
    """The family named ``name`` (``MoEConfig.scoring``); a ValueError naming the known ones otherwise."""
    family = FAMILIES.get(name) if isinstance(name, str) else None
    if family is None:
        raise ValueError(f"scoring must be one of {sorted(FAMILIES)} (dispatch.families), got {name!r}")
    return family


def for_model_type(model_type: str) -> tuple[RoutingFamily, HFMapping]:
    """(family, mapping) of a transformers ``model_type``; a ValueError naming the supported ones."""
    for family in FAMILIES.values():
        if model_type in family.hf:
            return family, family.hf[model_type]
    raise ValueError(f"model_type must be one of {model_types()}, got {model_type!r}")


def model_types() -> tuple[str, ...]:
    """Every transformers model type some family maps."""
    return tuple(t for f in FAMILIES.values() for t in f.hf)
