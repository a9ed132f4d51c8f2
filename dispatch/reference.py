"""The reference MoE layer in plain PyTorch: the ground truth every kernel is checked against.

    x_TH → router logits_TE → scores → top-K → weights_TK, ids_TK
         → per-expert gated MLP loop (SwiGLU, GeGLU: ``cfg.activation``) → y_TH (+ shared expert)

It is written to reproduce transformers 5's MoE blocks bit for bit in fp32: the same ops in the
same order (rows of an expert gathered in (k, t) order; contributions added into a zero fp32/x-dtype
buffer expert by expert, in ascending expert id — that is this layer's fixed summation order).
``tests/test_hf.py`` checks it for OLMoE, Mixtral, Qwen2-MoE and Qwen3-MoE (router logits, weights,
ids and output all ``torch.equal``). Two known, bounded exceptions:
  * DeepSeek-V3: transformers takes ``topk(sorted=False)``; we keep topk order (k = 0 is the best
    choice). Same ids per token as sets; the renormalisation sum runs in another order, so the
    weights may differ by an ulp and the output by < 4 ulp of its largest entry.
  * bf16 Mixtral / DeepSeek-V3: transformers scales an expert's output by the fp32 weight and
    rounds once; we round the weight to the input dtype first (as OLMoE / Qwen do): a few ulp.
As a module: ``dispatch.MoELayer(cfg, w, path="torch")`` (or ``MoELayer.from_hf(block, hf_config,
path="torch")``) runs exactly this layer and can replace a transformers block.
Bad ids and non-finite tokens follow :mod:`dispatch.checks`: an id outside [0, E) adds
nothing (``check_ids=True`` raises); a NaN/Inf token gives a non-finite row and disturbs no other.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dispatch import activations, families
from dispatch.checks import check_experts_inputs
from dispatch.config import MoEConfig, MoEWeights


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Norm-wise relative error ‖y − ref‖ / ‖ref‖ in fp32 (the tuner's, benchmarks' and quantization
    gates' measure)."""
    return ((y.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def check_input(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights | None = None) -> None:
    """Raise ValueError unless ``x_TH`` is a floating [T, H] tensor matching ``cfg`` (and ``w``)."""
    if not isinstance(x_TH, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x_TH).__name__}")
    if not x_TH.is_floating_point():
        raise ValueError(f"x must be floating point, got dtype {x_TH.dtype}")
    if x_TH.dim() != 2 or x_TH.shape[1] != cfg.hidden_size:
        raise ValueError(f"x must have shape [T, H={cfg.hidden_size}], got {tuple(x_TH.shape)}")
    if w is not None:
        w.validate(cfg)
        if w.router_EH.device != x_TH.device:
            raise ValueError(f"x is on {x_TH.device} but the weights are on {w.router_EH.device}")
        if w.gate_up_E2IH.dtype != x_TH.dtype:
            raise ValueError(f"x has dtype {x_TH.dtype} but the expert weights are {w.gate_up_E2IH.dtype}")


def route_reference(logits_TE: torch.Tensor, cfg: MoEConfig, bias_E: torch.Tensor | None = None):
    """Router logits → (weights_TK fp32, ids_TK int64); k = 0 is each token's first choice.

    The math is the routing family's (``cfg.scoring``, :mod:`dispatch.families`), e.g. softmax: p =
    softmax(logits) in fp32, top-K of p, optionally renormalised; sigmoid (DeepSeek-V3): s =
    sigmoid(logits); choice scores s + bias_E; the best ``topk_group`` of ``n_group`` groups are kept;
    top-K of the kept choice scores; weights the *unbiased* s, renormalised, × routed_scaling_factor.
    """
    if not isinstance(logits_TE, torch.Tensor) or logits_TE.dim() != 2 or not logits_TE.is_floating_point():
        got = f"{getattr(logits_TE, 'dtype', type(logits_TE).__name__)} {tuple(getattr(logits_TE, 'shape', ()))}"
        raise ValueError(f"logits must be a floating [T, E={cfg.num_experts}] tensor, got {got}")
    E = logits_TE.shape[1]
    if E != cfg.num_experts:
        raise ValueError(f"logits must have E={cfg.num_experts} columns, got {E}")
    return families.get(cfg.scoring).reference(logits_TE, cfg, bias_E)


def gated_act(gate_up_M2I: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    """The gated activation of a gate|up product: act(gate) * up — [M, 2I] → [M, I] (``activation``:
    :mod:`dispatch.activations`; "silu" is SwiGLU)."""
    gate_MI, up_MI = gate_up_M2I.chunk(2, dim=-1)
    return activations.gated(gate_MI, up_MI, activation)


def gated_expert(x_MH: torch.Tensor, gate_up_2IH: torch.Tensor, down_HI: torch.Tensor,
                 activation: str = "silu") -> torch.Tensor:
    """One gated expert: down(act(gate(x)) * up(x)) — [M, H] → [M, H]."""
    return F.linear(gated_act(F.linear(x_MH, gate_up_2IH), activation), down_HI)


def experts_reference(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, *, check_ids: bool = False,
                      activation: str = "silu") -> torch.Tensor:
    """The routed experts, one at a time: y_TH = Σ_k weights_TK[t,k] · expert_{ids_TK[t,k]}(x_t).

    Each expert's rows are gathered in (k, t) order; contributions are added expert by expert in
    ascending id (the layer's fixed summation order). Experts that receive nothing are skipped, and
    so are ids outside [0, E) (``check_ids=True``: a ValueError instead). ``activation``: the experts'
    gated activation (:mod:`dispatch.activations`).
    """
    E = check_experts_inputs(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, check_ids=check_ids)[2]
    if torch.compiler.is_compiling():  # no host read of the routing under torch.compile
        return experts_static(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, activation)
    y_TH = torch.zeros_like(x_TH)
    for e in torch.unique(ids_TK).tolist():  # ascending
        if not 0 <= e < E:
            continue
        k_pos, t_idx = torch.where(ids_TK.T == e)
        out_MH = gated_expert(x_TH[t_idx], gate_up_E2IH[e], down_EHI[e], activation)
        out_MH = out_MH * weights_TK[t_idx, k_pos, None].to(out_MH.dtype)
        y_TH.index_add_(0, t_idx, out_MH.to(y_TH.dtype))
    return y_TH


def experts_static(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, activation: str = "silu") -> torch.Tensor:
    """:func:`experts_reference`'s sum in a form that reads nothing of the routing on the host (what
    ``torch.compile`` traces, ``fullgraph=True``, for any T): every expert runs on every token, in
    ascending id, and a token keeps the outputs of the experts it chose, times their weights (an id
    outside [0, E) matches no expert: it adds nothing). E·T rows of expert work instead of T·K: the
    form for tracing and tests. Equal to the eager loop up to rounding (an expert's rows are computed
    in one GEMM with every token's instead of the chosen ones')."""
    y_TH = torch.zeros_like(x_TH)
    for e in range(gate_up_E2IH.shape[0]):  # static: the weights' E, not the routing's
        hit_TK = ids_TK == e
        chosen_T1 = hit_TK.any(dim=1, keepdim=True)
        w_T1 = torch.where(hit_TK, weights_TK, 0).sum(dim=1, keepdim=True).to(x_TH.dtype)
        out_TH = gated_expert(x_TH, gate_up_E2IH[e], down_EHI[e], activation)
        y_TH = y_TH + torch.where(chosen_T1, out_TH * w_T1, 0)
    return y_TH


def shared_reference(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor | None:
    """The shared expert (Qwen2-MoE: behind a sigmoid gate; DeepSeek: ungated), or None."""
    if not cfg.shared_intermediate_size:
        return None
    # Two GEMMs, not one fused: transformers' shared MLP is three nn.Linear, and a GEMM of 2S
    # output columns may round differently from two of S (the fused form is off by ~1 ulp on CPU).
    S = cfg.shared_intermediate_size
    gate_TS, up_TS = F.linear(x_TH, w.shared_gate_up_2SH[:S]), F.linear(x_TH, w.shared_gate_up_2SH[S:])
    # (act(gate) * up on the two products as they are: a concatenated copy rounds differently on CPU)
    out_TH = F.linear(activations.gated(gate_TS, up_TS, cfg.activation), w.shared_down_HS)
    if cfg.shared_gate:
        out_TH = torch.sigmoid(F.linear(x_TH, w.shared_gate_1H)) * out_TH
    return out_TH


def shared_as_experts(shared_gate_up_2SH: torch.Tensor, shared_down_HS: torch.Tensor, I: int):  # noqa: E741
    """An ungated shared expert of S = n·I columns as n experts of the routed experts' shape, copies:
    ([n, 2I, H] gate|up, [n, H, I] down). A gated MLP is separable over the intermediate dimension,
    W_down (act(W_gate x) ⊙ W_up x) = Σ_j W_down[:, J] (act(W_gate[J] x) ⊙ W_up[J] x) over the n
    chunks J = j·I .. (j+1)·I-1, so the n experts, each with weight 1, sum to the shared expert."""
    S = shared_down_HS.shape[1]
    if S % I:
        raise ValueError(f"the shared expert's S={S} columns must be a multiple of I={I}")
    gu, chunks = shared_gate_up_2SH, range(S // I)
    gate_up = torch.stack([torch.cat([gu[j * I:(j + 1) * I], gu[S + j * I:S + (j + 1) * I]]) for j in chunks])
    return gate_up, torch.stack([shared_down_HS[:, j * I:(j + 1) * I] for j in chunks])


def router_logits(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor:
    """x_TH @ router_EH.T — in fp32 where the routing family scores fp32 logits (sigmoid: DeepSeek-V3),
    as transformers does."""
    if families.get(cfg.scoring).fp32_logits:
        return F.linear(x_TH.float(), w.router_EH.float())
    return F.linear(x_TH, w.router_EH)


def moe_reference(x_TH: torch.Tensor, cfg: MoEConfig, w: MoEWeights) -> torch.Tensor:
    """The whole layer: [T, H] → [T, H]. An empty batch (T = 0) returns an empty output."""
    check_input(x_TH, cfg, w)
    if x_TH.shape[0] == 0:
        return x_TH.new_zeros(0, cfg.hidden_size)
    weights_TK, ids_TK = route_reference(router_logits(x_TH, cfg, w), cfg, w.bias_E)
    y_TH = experts_reference(x_TH, weights_TK.to(x_TH.dtype), ids_TK, w.gate_up_E2IH, w.down_EHI,
                             activation=cfg.activation)
    shared_TH = shared_reference(x_TH, cfg, w)
    return y_TH if shared_TH is None else y_TH + shared_TH
