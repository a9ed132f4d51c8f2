"""Chapter 0, exercise 2: softmax top-K routing.

Given router logits [T, E], compute in fp32 the softmax over experts, keep each token's K largest
probabilities (k = 0 the largest) and, when ``renormalize``, divide them by their sum so that each
token's weights add up to one. Return ``(weights_TK fp32, ids_TK int64)``.
"""
import torch


def route(logits_TE: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    probs_TE = torch.softmax(logits_TE.float(), dim=-1)
    weights_TK, ids_TK = torch.topk(probs_TE, k, dim=-1)
    if renormalize:
        weights_TK = weights_TK / weights_TK.sum(dim=-1, keepdim=True)
    return weights_TK, ids_TK
