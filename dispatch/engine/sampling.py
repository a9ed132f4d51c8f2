"""Next-token choice without a host sync (so it can sit inside a captured CUDA graph).

Greedy: ``argmax`` (the lowest id wins a tie, as in transformers). Sampling: temperature, then
top-p (the smallest set of most likely tokens whose probability reaches ``top_p``; the most likely
token is always kept), then one draw by the exponential race: ``argmax(p_i / e_i)`` with
``e_i ~ Exp(1)`` picks token i with probability p_i / Σp over the kept tokens — the same law as
``torch.multinomial``, without its host-side checks. ``temperature`` and ``top_p`` are 0-d tensors
read at run time, so a captured graph serves every setting.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 → greedy; else temperature > 0, 0 < top_p ≤ 1; ``seed`` makes draws repeatable."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        for name in ("temperature", "top_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"SamplingParams.{name} must be a number, got {v!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ValueError(f"SamplingParams.seed must be an int, got {self.seed!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def load_sampling(params: SamplingParams, temperature: torch.Tensor, top_p: torch.Tensor,
                  generator: torch.Generator | None) -> None:
    """Put ``params`` where a (captured) step reads them: the 0-d ``temperature`` (1 when greedy: the
    greedy step does not read it) and ``top_p`` tensors, and the seed of the draws (``generator``, or
    the CUDA default generator when it is None)."""
    temperature.fill_(params.temperature or 1.0)
    top_p.fill_(params.top_p)
    if generator is not None:
        generator.manual_seed(params.seed)
    else:
        torch.cuda.manual_seed(params.seed)


def sample(logits_BV: torch.Tensor, temperature: torch.Tensor | None = None, top_p: torch.Tensor | None = None,
           *, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token per row, int64 [B]: greedy when ``temperature`` is None, else one draw."""
    if temperature is None:
        return logits_BV.argmax(dim=-1)
    probs_BV = torch.softmax(logits_BV.float() / temperature, dim=-1)
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True)
    before_BV = sorted_BV.cumsum(dim=-1) - sorted_BV  # mass of the more likely tokens
    kept_BV = sorted_BV.masked_fill(before_BV >= top_p, 0.0)
    race_BV = torch.empty_like(kept_BV).exponential_(generator=generator)
    pick_B1 = (kept_BV / race_BV).argmax(dim=-1, keepdim=True)
    return order_BV.gather(-1, pick_B1)[:, 0]


def sampling_probs(logits_NV: torch.Tensor, temperature: torch.Tensor | float, top_p: torch.Tensor | float
                   ) -> torch.Tensor:
    """The distribution :func:`sample` draws from, fp32 [N, V] in vocabulary order: softmax of the
    logits over ``temperature``, cut to the top-p set (the same rule: a token is kept while the mass
    of the more likely tokens is below ``top_p``) and renormalised. No host sync."""
    probs_NV = torch.softmax(logits_NV.float() / temperature, dim=-1)
    sorted_NV, order_NV = probs_NV.sort(dim=-1, descending=True)
    kept_NV = sorted_NV.masked_fill(sorted_NV.cumsum(dim=-1) - sorted_NV >= top_p, 0.0)
    kept_NV = kept_NV / kept_NV.sum(dim=-1, keepdim=True)
    return torch.zeros_like(kept_NV).scatter_(-1, order_NV, kept_NV)


def draw(weights_NV: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row from non-negative (unnormalised) weights, by the exponential race
    ``argmax(w / e)``, e ~ Exp(1): token i with probability w_i / Σw, no host sync. int64 [N]."""
    race_NV = torch.empty_like(weights_NV, dtype=torch.float32).exponential_(generator=generator)
    return (weights_NV.float() / race_NV).argmax(dim=-1)


def sample_torch(logits_BV: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    """The plain twin of :func:`sample` with ``torch.multinomial`` (same distribution, other draws)."""
    if params.greedy:
        return logits_BV.argmax(dim=-1)
    probs_BV = torch.softmax(logits_BV.float() / params.temperature, dim=-1)
    sorted_BV, order_BV = probs_BV.sort(dim=-1, descending=True)
    kept_BV = sorted_BV.masked_fill(sorted_BV.cumsum(-1) - sorted_BV >= params.top_p, 0.0)
    pick_B1 = torch.multinomial(kept_BV, 1, generator=generator)
    return order_BV.gather(-1, pick_B1)[:, 0]
