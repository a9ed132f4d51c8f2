"""Chapter 0, exercise 1: DeepSeek-V3's routing — a bias that only chooses, in groups.

From router logits [T, E] and a per-expert correction bias [E], route every token as
DeepSeek-V3 does:

1. scores s = sigmoid(logits), in fp32;
2. choice scores c = s + bias: the bias takes part in *choosing* experts, nothing else;
3. the E experts form ``n_group`` groups of E / n_group consecutive ids; a group scores the sum
   of its two largest choice scores (its one score if it holds one expert); only the
   ``topk_group`` best groups stay in the race;
4. the K experts of largest choice score within the kept groups are the token's ids;
5. their weights are their scores s, divided by the sum of the K scores, times ``scaling``.

Return ``(weights_TK fp32, ids_TK int64)``; the order of a token's K (id, weight) pairs is free.
T may be 0.
"""
import torch


def route_v3(logits_TE: torch.Tensor, bias_E: torch.Tensor, top_k: int, n_group: int, topk_group: int,
             scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    raise NotImplementedError("complete route_v3 in exercises/ch00_route_v3.py")
