"""Top-K over every expert: the group limit forgotten."""


def route_v3(logits_TE, bias_E, top_k, n_group, topk_group, scaling):
    s_TE = logits_TE.float().sigmoid()
    ids_TK = (s_TE + bias_E.float()).topk(top_k, dim=-1).indices
    w_TK = s_TE.gather(1, ids_TK)
    return w_TK / w_TK.sum(-1, keepdim=True) * scaling, ids_TK
