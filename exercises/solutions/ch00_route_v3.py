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
    T, E = logits_TE.shape
    s_TE = logits_TE.float().sigmoid()
    c_TE = s_TE + bias_E.float()
    size = E // n_group
    c_TGS = c_TE.view(T, n_group, size)
    group_TG = c_TGS.topk(min(2, size), dim=-1).values.sum(-1)
    keep_TG = torch.zeros_like(group_TG, dtype=torch.bool)
    keep_TG.scatter_(1, group_TG.topk(topk_group, dim=-1).indices, True)
    c_TE = c_TE.masked_fill(~keep_TG.repeat_interleave(size, dim=1), float("-inf"))
    ids_TK = c_TE.topk(top_k, dim=-1).indices
    w_TK = s_TE.gather(1, ids_TK)  # the unbiased scores
    return w_TK / w_TK.sum(-1, keepdim=True) * scaling, ids_TK
