"""A group scored by its best expert alone, not by the sum of its two best."""
import torch


def route_v3(logits_TE, bias_E, top_k, n_group, topk_group, scaling):
    T, E = logits_TE.shape
    s_TE = logits_TE.float().sigmoid()
    c_TE = s_TE + bias_E.float()
    size = E // n_group
    group_TG = c_TE.view(T, n_group, size).amax(-1)
    keep_TG = torch.zeros_like(group_TG, dtype=torch.bool)
    keep_TG.scatter_(1, group_TG.topk(topk_group, dim=-1).indices, True)
    c_TE = c_TE.masked_fill(~keep_TG.repeat_interleave(size, dim=1), float("-inf"))
    ids_TK = c_TE.topk(top_k, dim=-1).indices
    w_TK = s_TE.gather(1, ids_TK)
    return w_TK / w_TK.sum(-1, keepdim=True) * scaling, ids_TK
