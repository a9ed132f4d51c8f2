"""torch.multinomial draws the token: its input checks read values on the host, which a graph cannot."""
import torch


def nucleus(logits_BV, temperature, top_p):
    probs_BV = torch.softmax(logits_BV.float() / temperature, dim=-1)
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True, stable=True)
    kept_BV = sorted_BV.masked_fill(sorted_BV.cumsum(dim=-1) - sorted_BV >= top_p, 0.0)
    kept_BV = kept_BV / kept_BV.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs_BV).scatter_(-1, order_BV, kept_BV)


def sample(logits_BV, temperature, top_p, generator):
    if temperature == 0:
        return logits_BV.argmax(dim=-1)
    return torch.multinomial(nucleus(logits_BV, temperature, top_p), 1, generator=generator).squeeze(-1)
