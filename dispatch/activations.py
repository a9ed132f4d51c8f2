"""Gated activations of the experts: h = act(gate) ⊙ up on the gate|up product, one entry each.

``MoEConfig.activation`` names the entry; everything that applies it reads this table — the reference
(:func:`dispatch.reference.gated`), every kernel epilogue (the ``ACT`` constexpr:
:func:`dispatch.kernels.helpers.gated`), the engine's dense layers and the transformers mapping
(``hidden_act``). An unknown name is a ValueError anywhere.

    name        code   act(g)                                             transformers hidden_act
    silu        0      g · sigmoid(g)                  (SwiGLU)           "silu", "swish"
    gelu        1      g · Φ(g) = ½ g (1 + erf(g / √2))   (GeGLU, exact)  "gelu"
    gelu_tanh   2      ½ g (1 + tanh(√(2/π) (g + 0.044715 g³)))  (GeGLU)  "gelu_pytorch_tanh"

The torch functions are the ones transformers' ``ACT2FN`` runs for those names, so the reference stays
bit for bit transformers' in fp32. The kernels compute the same functions in fp32 registers (tanh as
2·sigmoid(2z) − 1, the identity Triton's math library lacks a tanh for), equal up to rounding.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Activation:
    """One gated activation: ``code`` is the kernels' ``ACT`` constexpr, ``fn`` the plain-PyTorch act(g),
    ``hf_names`` the transformers ``hidden_act`` values that mean it."""

    name: str
    code: int
    fn: Callable[[torch.Tensor], torch.Tensor]
    hf_names: tuple[str, ...]


ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("silu", 0, F.silu, ("silu", "swish")),
    Activation("gelu", 1, F.gelu, ("gelu",)),
    Activation("gelu_tanh", 2, lambda g: F.gelu(g, approximate="tanh"), ("gelu_pytorch_tanh",)),
)}


def get(name: str) -> Activation:
    """The activation named ``name``; a ValueError naming the known ones otherwise."""
    act = ACTIVATIONS.get(name) if isinstance(name, str) else None
    if act is None:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} (dispatch.activations), got {name!r}")
    return act


def from_hf(hidden_act: str) -> Activation:
    """The activation of a transformers ``hidden_act``; a ValueError naming the supported ones."""
    for act in ACTIVATIONS.values():
        if hidden_act in act.hf_names:
            return act
    names = sorted(n for a in ACTIVATIONS.values() for n in a.hf_names)
    raise ValueError(f"the experts are gated (act(gate) · up): hidden_act must be one of {names}, got {hidden_act!r}")


def gated(gate: torch.Tensor, up: torch.Tensor, name: str = "silu") -> torch.Tensor:
    """act(gate) · up for the activation ``name``, in the inputs' dtype (as transformers' experts)."""
    return get(name).fn(gate) * up


def by_code(code: int) -> Activation:
    """The activation whose kernel code is ``code`` (the ops carry the code, an int)."""
    for act in ACTIVATIONS.values():
        if act.code == code:
            return act
    raise ValueError(f"no activation has code {code!r}; codes: {sorted(a.code for a in ACTIVATIONS.values())}")
