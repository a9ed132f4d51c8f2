"""Chapter 0, exercise 1: one SwiGLU expert.

An expert maps a row x (length H) to ``W_down · (silu(W_gate · x) ⊙ (W_up · x))``. The gate and
up weights are stored stacked as one [2I, H] matrix, ``gate_up_2IH``: rows 0..I-1 are the gate,
rows I..2I-1 the up projection. ``down_HI`` is [H, I]. silu(z) = z · sigmoid(z).

Complete ``swiglu_expert`` for a batch of M rows (M may be 0).
"""
import torch


def swiglu_expert(x_MH: torch.Tensor, gate_up_2IH: torch.Tensor, down_HI: torch.Tensor) -> torch.Tensor:
    """[M, H] → [M, H]."""
    I = down_HI.shape[1]  # noqa: E741
    gate_MI = x_MH @ gate_up_2IH[:I].T
    up_MI = x_MH @ gate_up_2IH[I:].T
    return (gate_MI * torch.sigmoid(gate_MI) * up_MI) @ down_HI.T
