"""A token stays while the mass up to and including it is below top_p: the token that crosses it is lost."""
import torch


def nucleus(logits_BV, temperature, top_p):
    probs_BV = torch.softmax(logits_BV.float() / temperature, dim=-1)
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True, stable=True)
    kept_BV = sorted_BV.masked_fill(sorted_BV.cumsum(dim=-1) > top_p, 0.0)
    kept_BV[..., 0] = sorted_BV[..., 0]
    kept_BV = kept_BV / kept_BV.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs_BV).scatter_(-1, order_BV, kept_BV)


def sample(logits_BV, temperature, top_p, generator):
    if temperature == 0:
        return logits_BV.argmax(dim=-1)
    p_BV = nucleus(logits_BV, temperature, top_p)
    return (p_BV / torch.empty_like(p_BV).exponential_(generator=generator)).argmax(dim=-1)
