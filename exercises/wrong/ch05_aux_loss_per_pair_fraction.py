"""f_e as the share of the T·K routed pairs instead of pairs per token: the uniform loss is 1, not K."""
import torch


def aux_loss(logits_TE: torch.Tensor, ids_TK: torch.Tensor) -> torch.Tensor:
    T, E = logits_TE.shape
    probs_TE = torch.softmax(logits_TE.float(), dim=-1)
    f_E = torch.bincount(ids_TK.flatten(), minlength=E).float() / ids_TK.numel()
    return E * (f_E * probs_TE.mean(0)).sum()
