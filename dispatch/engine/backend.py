"""This package's experts as a transformers experts implementation named ``"dispatch"``.

transformers 5 decorates each family's experts module (``OlmoeExperts``, ``MixtralExperts``,
``Qwen2MoeExperts``, ``Qwen3MoeExperts``, ``DeepseekV3Experts``) with
``@use_experts_implementation``: its ``forward(hidden_states [T, H], top_k_index [T, K],
top_k_weights [T, K])`` looks up ``config._experts_implementation`` in the class-wide registry
``ExpertsInterface`` on every call. :func:`register` adds one entry there, so (5.17 and 5.24 alike)

    register()
    model = AutoModelForCausalLM.from_pretrained(path, experts_implementation="dispatch")
    model.set_experts_implementation("dispatch")          # or switch a loaded model

The router, the shared experts and everything else stay transformers' own; only the routed
experts change; their gated activation is the model's ``hidden_act`` (SwiGLU, GeGLU exact or tanh:
:mod:`dispatch.activations`; another is a ValueError). Paths, picked per call by token count and
device (:func:`experts_path`):

    CUDA           T <= the shape's crossover (``tiles.resolve("crossover", ...)``: the tuned
                   table's, else DECODE_MAX_TOKENS): ``moe_decode`` (grouped GEMV); above: ``moe_experts``
    CPU (default)  the plain-PyTorch reference (``experts_reference``)
    CPU, asked     the Triton kernels under the interpreter (``set_cpu_path("kernels")``, fp32/fp16)
"""
from __future__ import annotations

import torch

from dispatch import activations
from dispatch.kernels import tiles
from dispatch.kernels.tiles import DECODE_MAX_TOKENS

NAME = "dispatch"
CPU_PATHS = ("reference", "kernels")
_state = {"cpu_path": "reference"}


def set_cpu_path(path: str) -> None:
    """Pick what the backend runs on CPU: 'reference' (plain PyTorch) or 'kernels' (interpreter)."""
    if path not in CPU_PATHS:
        raise ValueError(f"cpu path must be one of {CPU_PATHS}, got {path!r}")
    _state["cpu_path"] = path


def experts_path(x_TH: torch.Tensor, crossover: int = DECODE_MAX_TOKENS) -> str:
    """'decode' | 'grouped' | 'reference': what :func:`experts_forward` runs for ``x_TH`` ("decode" for
    T <= ``crossover``)."""
    if x_TH.device.type == "cpu" and (_state["cpu_path"] == "reference" or x_TH.dtype == torch.bfloat16):
        return "reference"
    return "decode" if x_TH.shape[0] <= crossover else "grouped"


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The ``"dispatch"`` experts forward: y_TH = Σ_k w_TK[t, k] · expert_{ids_TK[t, k]}(x_t)."""
    if getattr(self, "has_bias", False) or getattr(self, "is_transposed", False) \
            or not getattr(self, "has_gate", True) or not getattr(self, "is_concatenated", True):
        raise ValueError(f"{type(self).__name__}: the dispatch experts need concatenated [gate; up] "
                         "weights [E, 2I, H], untransposed, without biases")
    act = activations.from_hf(getattr(self.config, "hidden_act", "silu")).name  # SwiGLU, GeGLU; else ValueError
    x_TH, gate_up, down = hidden_states, self.gate_up_proj, self.down_proj
    crossover = DECODE_MAX_TOKENS
    if x_TH.is_cuda:  # the shape's tuned crossover (a cached lookup)
        E, I2, H = gate_up.shape
        crossover = tiles.resolve("crossover", (0, top_k_index.shape[1], E, H, I2 // 2), x_TH.dtype,
                                  x_TH.device).config
    path = experts_path(x_TH, crossover)
    if path == "reference":
        from dispatch.reference import experts_reference

        return experts_reference(x_TH, top_k_weights.to(x_TH.dtype), top_k_index, gate_up, down, activation=act)
    if path == "decode":
        from dispatch.kernels.gemv import moe_decode

        return moe_decode(x_TH, top_k_weights, top_k_index, gate_up, down, activation=act)
    from dispatch.kernels.grouped_gemm import moe_experts

    return moe_experts(x_TH, top_k_weights, top_k_index, gate_up, down, activation=act)


def register() -> None:
    """Add ``"dispatch"`` to transformers' experts registry (idempotent; 5.17 and later)."""
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError as e:  # transformers < 5 has no experts interface
        raise ImportError("the dispatch experts backend needs transformers >= 5.17 "
                          "(transformers.integrations.moe.ExpertsInterface)") from e
    ExpertsInterface.register(NAME, experts_forward)


def use_dispatch_experts(model) -> None:
    """Register, then switch a loaded transformers MoE model to the ``"dispatch"`` experts."""
    register()
    model.set_experts_implementation(NAME)
    if model.config._experts_implementation != NAME:
        raise ValueError(f"{type(model).__name__} did not take experts_implementation={NAME!r} "
                         "(its experts module is not decorated with @use_experts_implementation)")
