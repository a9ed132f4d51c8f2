"""Chapter 6, exercise 3: temperature and top-p sampling, on the device.

From logits [B, V]: divide by ``temperature`` and take the softmax (fp32). Top-p keeps the
smallest set of most likely tokens whose probability reaches ``top_p``: going down the tokens in
order of probability (the lower id first among equal ones), token i stays while the mass of the
tokens before it is below ``top_p``, so the most likely token always stays. Renormalise the kept
ones. Complete:

* ``nucleus(logits_BV, temperature, top_p)``: those probabilities, fp32 [B, V] in vocabulary
  order, 0 for the dropped tokens (temperature > 0, 0 < top_p ≤ 1);
* ``sample(logits_BV, temperature, top_p, generator)``: one token per row, int64 [B], drawn from
  ``nucleus`` with ``generator`` only (the same seed gives the same tokens) and without waiting
  for the host: no ``.item()``, ``.tolist()`` or ``torch.multinomial`` (its checks sync), so
  that the draw can sit in a CUDA graph. One way: ``argmax(p / e)`` with ``e ~ Exp(1)``
  (``torch.empty_like(p).exponential_(generator=generator)``) picks token i with probability
  p_i. ``temperature == 0`` means greedy: the argmax, the lower id on a tie.

Example: logits log([0.5, 0.3, 0.2]), temperature 1, top_p 0.7 → [0.625, 0.375, 0]: the mass
before token 1 is 0.5 < 0.7, before token 2 it is 0.8.
"""
import torch


def nucleus(logits_BV: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    probs_BV = torch.softmax(logits_BV.float() / temperature, dim=-1)
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True, stable=True)
    before_BV = sorted_BV.cumsum(dim=-1) - sorted_BV  # the mass of the more likely tokens
    kept_BV = sorted_BV.masked_fill(before_BV >= top_p, 0.0)
    kept_BV = kept_BV / kept_BV.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs_BV).scatter_(-1, order_BV, kept_BV)


def sample(logits_BV: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator) -> torch.Tensor:
    if temperature == 0:
        return logits_BV.argmax(dim=-1)
    p_BV = nucleus(logits_BV, temperature, top_p)
    race_BV = torch.empty_like(p_BV).exponential_(generator=generator)
    return (p_BV / race_BV).argmax(dim=-1)
