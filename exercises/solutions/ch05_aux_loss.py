"""Chapter 5, exercise 1: the Switch Transformer load-balancing loss.

For one layer with router logits [T, E] and chosen ids [T, K]: f_e = (routed pairs to e) / T and
P_e = mean over tokens of softmax(logits)_e (fp32). The loss is ``E · Σ_e f_e · P_e``; it equals K
when routing is perfectly uniform. Return a 0-d fp32 tensor that gradients flow through (via P).
"""
import torch


def aux_loss(logits_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    T, E = logits_TE.shape
    probs_TE = torch.softmax(logits_TE.float(), dim=-1)
    f_E = torch.bincount(ids_TK.flatten(), minlength=E).float() / T
    return E * (f_E * probs_TE.mean(0)).sum()
