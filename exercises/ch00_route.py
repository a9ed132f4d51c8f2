"""Chapter 0, exercise 2: softmax top-K routing.

Given router logits [T, E], compute in fp32 the softmax over experts, keep each token's K largest
probabilities (k = 0 the largest) and, when ``renormalize``, divide them by their sum so that each
token's weights add up to one. Return ``(weights_TK fp32, ids_TK int64)``.
"""
import torch


def route(logits_TE: torch.Tensor, k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("complete route in exercises/ch00_route.py")
