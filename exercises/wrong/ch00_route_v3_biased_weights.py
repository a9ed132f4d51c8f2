"""Weights from the choice scores s + bias: the bias leaks into the output."""
import torch


def route_v3(logits_TE, bias_E, top_k, n_group, topk_group, scaling):
    T, E = logits_TE.shape
    c_TE = logits_TE.float().sigmoid() + bias_E.float()
    size = E // n_group
    group_TG = c_TE.view(T, n_group, size).topk(min(2, size), dim=-1).values.sum(-1)
    keep_TG = torch.zeros_like(group_TG, dtype=torch.bool)
    keep_TG.scatter_(1, group_TG.topk(topk_group, dim=-1).indices, True)
    masked = c_TE.masked_fill(~keep_TG.repeat_interleave(size, dim=1), float("-inf"))
    ids_TK = masked.topk(top_k, dim=-1).indices
    w_TK = c_TE.gather(1, ids_TK)
    return w_TK / w_TK.sum(-1, keepdim=True) * scaling, ids_TK
