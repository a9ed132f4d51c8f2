"""transformers' own experts implementations, as benchmark contestants and test references.

transformers 5 stores an MoE layer's experts as one module (``OlmoeExperts``: ``gate_up_proj``
[E, 2I, H], ``down_proj`` [E, H, I] — our layout) whose forward is picked at call time by the
``@use_experts_implementation`` decorator from ``config._experts_implementation``:
``"eager"`` (a Python loop over the experts hit), ``"grouped_mm"`` (sort + ``torch._grouped_mm``)
and ``"batched_mm"`` (gather each routed row's expert weights, then ``bmm``). The same module
serves every benchmark shape (Mixtral's, DeepSeek's and Qwen3's experts do the same math).

Works with transformers 5.17 (GPU image) and 5.2x (CPU): we set the config attribute, read it
back, and fall back to calling the registered function directly if the module ignores it.
"""
from __future__ import annotations

import torch

IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def build_experts(gate_up_E2IH: torch.Tensor, down_EHI: torch.Tensor, implementation: str = "eager"):
    """An ``OlmoeExperts`` holding (views of) our weights, set to ``implementation``."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    from transformers import OlmoeConfig
    from transformers.models.olmoe.modeling_olmoe import OlmoeExperts

    E, I2, H = gate_up_E2IH.shape
    cfg = OlmoeConfig(hidden_size=H, intermediate_size=I2 // 2, num_experts=E, num_experts_per_tok=1,
                      hidden_act="silu")
    with torch.device("meta"):
        mod = OlmoeExperts(cfg)
    mod.gate_up_proj = torch.nn.Parameter(gate_up_E2IH, requires_grad=False)
    mod.down_proj = torch.nn.Parameter(down_EHI, requires_grad=False)
    set_implementation(mod, implementation)
    return mod


def set_implementation(mod, implementation: str) -> None:
    mod.config._experts_implementation = implementation
    mod._dispatch_impl = implementation
    if getattr(mod.config, "_experts_implementation", None) != implementation:
        mod._dispatch_direct = True  # this transformers ignores the attribute: call the function directly


def run_experts(mod, x_TH: torch.Tensor, weights_TK: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    """Call the module's forward (transformers' argument order: hidden, top_k_index, top_k_weights)."""
    impl = getattr(mod, "_dispatch_impl", "eager")
    if getattr(mod, "_dispatch_direct", False) and impl != "eager":
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

        return ALL_EXPERTS_FUNCTIONS[impl](mod, x_TH, ids_TK, weights_TK.to(x_TH.dtype))
    return mod(x_TH, ids_TK, weights_TK.to(x_TH.dtype))


def hf_experts(x_TH, weights_TK, ids_TK, gate_up_E2IH, down_EHI, implementation: str = "grouped_mm"):
    """One call of transformers' experts with our tensors (same signature as ``moe_experts``)."""
    mod = build_experts(gate_up_E2IH, down_EHI, implementation)
    with torch.no_grad():
        return run_experts(mod, x_TH, weights_TK, ids_TK)


def unavailable_reason(implementation: str, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why an implementation cannot run here (None if it can)."""
    if implementation == "grouped_mm" and not (hasattr(torch.nn.functional, "grouped_mm")
                                               or hasattr(torch, "_grouped_mm")):
        return "this torch has no grouped_mm (transformers falls back to a loop)"
    return None


def fp8_experts(qe):
    """transformers' own fine-grained fp8 experts (``FP8Experts``, 128 × 128 weight blocks,
    activations quantized per token and 128 columns) holding our fp8-block128 codes and scales:
    its loop over the experts hit, each projection through transformers' fp8 linear, which runs
    DeepGEMM or the ``kernels-community/finegrained-fp8`` Triton kernel — both fetched from the
    Hugging Face Hub by the ``kernels`` package on first use. Call as ``mod(x, ids, weights)``."""
    if qe.scheme != "fp8-block128":
        raise ValueError(f"transformers' fp8 experts store 128x128 blocks: fp8-block128, got {qe.scheme}")
    from transformers import OlmoeConfig
    from transformers.integrations.finegrained_fp8 import FP8Experts

    cfg = OlmoeConfig(hidden_size=qe.H, intermediate_size=qe.I, num_experts=qe.E, num_experts_per_tok=1,
                      hidden_act="silu")
    with torch.device("meta"):
        mod = FP8Experts(cfg, block_size=(128, 128))
    for name, t in (("gate_up_proj", qe.gate_up), ("down_proj", qe.down)):  # their scale_inv: w = q · s
        setattr(mod, name, torch.nn.Parameter(t.q, requires_grad=False))
        setattr(mod, name + "_scale_inv", torch.nn.Parameter(t.scale, requires_grad=False))
    return mod
