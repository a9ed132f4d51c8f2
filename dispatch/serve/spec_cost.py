"""What a speculative step buys, what it costs on an MoE, and the draft length that pays best.

Tokens a step buys (Leviathan et al. 2023): if each draft is kept with probability α, independently,
until the first refusal, a step with k drafts emits on average

    tokens(α, k) = 1 + α + α² + … + α^k = (1 − α^{k+1}) / (1 − α)

What it costs: c(k), the time of a step with k drafts (drafting + one verify forward of k+1 tokens).
On a dense model at batch 1 the verify forward reads the same weights for k+1 tokens as for one, so
c(k) ≈ c(0) until the arithmetic shows. On an MoE the k+1 tokens route to more distinct experts —
E·(1 − (1 − K/E)^{k+1}) per layer under independent uniform routing
(:func:`dispatch.arithmetic.expected_unique_experts`) — and each one is 3·H·I more weights to read:
:func:`verify_bytes` counts them. The best fixed k maximises tokens(α, k) / c(k); :class:`AdaptiveK`
estimates α from the steps it sees and takes that k at every step.

A recorded acceptance trace ``runs`` (one sequence): runs[p] = how many drafts a step would keep
when the sequence's last token is its p-th (the drafter's longest correct guess there). A step
with k drafts keeps min(k, runs[p]) and moves to p + min(k, runs[p]) + 1: :func:`simulate` replays
any policy on a trace, exactly, for a greedy drafter whose shorter drafts are prefixes of its longer.
"""
from __future__ import annotations

from typing import Sequence

from dispatch.arithmetic import ModelShape, expected_unique_experts, expert_params, param_counts


def expected_tokens(alpha: float, k: int) -> float:
    """Mean tokens a step with k drafts emits when each draft is kept with probability α."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"need 0 <= alpha <= 1 and k >= 0, got alpha={alpha!r}, k={k!r}")
    return float(k + 1) if alpha == 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _check_costs(costs: Sequence[float]) -> None:
    if not costs or any(not c > 0 for c in costs):
        raise ValueError(f"costs must be positive step times for k = 0, 1, …, got {list(costs)!r}")


def best_k(alpha: float, costs: Sequence[float], k_min: int = 0) -> int:
    """The k in [k_min, len(costs) − 1] with the most tokens per unit of time (ties: the smaller k)."""
    _check_costs(costs)
    if not 0 <= k_min < len(costs):
        raise ValueError(f"k_min={k_min} must index the costs (k = 0 … {len(costs) - 1})")
    return max(range(k_min, len(costs)), key=lambda k: (expected_tokens(alpha, k) / costs[k], -k))


def verify_bytes(shape: ModelShape, k: int, itemsize: int = 2) -> dict[str, float]:
    """Bytes one verify step of k+1 tokens of one sequence reads (uniform routing; the KV cache left
    out): the weights every token needs once, and per MoE layer the experts its k+1 tokens touch."""
    p, m = param_counts(shape), shape.moe
    touched = expected_unique_experts(m.E, m.K, k + 1)
    experts = shape.moe_layers * touched * expert_params(m) * itemsize
    dense = (p["total"] - p["embedding"] - p["experts"] + (k + 1) * m.hidden_size) * itemsize
    return {"dense": float(dense), "experts": float(experts), "total": float(dense + experts),
            "experts_per_layer": touched}


class AdaptiveK:
    """Picks k per step from a running estimate of the acceptance rate α and the step costs.

    ``costs[k]``: the time (any unit) of a step with k drafts, k = 0 … len(costs) − 1 (measured: the
    ``speculative`` benchmark's ``verify_cost`` rows). α̂ = (kept + α₀·w₀) / (tried + w₀), where
    kept and tried decay by ``decay`` every step (a draft is tried when every draft before it was
    kept): old evidence fades, so a run of copyable text raises k within a few steps and a run of
    new text lowers it. With no evidence left α̂ returns to the prior α₀, so k = 0 is never final.
    """

    def __init__(self, costs: Sequence[float], *, k_min: int = 0, k_max: int | None = None, prior: float = 0.5,
                 prior_weight: float = 2.0, decay: float = 0.9):
        _check_costs(costs)
        self.costs = [float(c) for c in costs]
        self.k_min, self.k_max = k_min, len(costs) - 1 if k_max is None else k_max
        if not 0 <= self.k_min <= self.k_max < len(costs):
            raise ValueError(f"need 0 <= k_min <= k_max < len(costs) = {len(costs)}, got {k_min}, {k_max}")
        if not 0 < prior < 1 or prior_weight <= 0 or not 0 < decay <= 1:
            raise ValueError("need 0 < prior < 1, prior_weight > 0 and 0 < decay <= 1")
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.kept = self.tried = 0.0

    @property
    def alpha(self) -> float:
        return (self.kept + self.prior * self.prior_weight) / (self.tried + self.prior_weight)

    def choose(self) -> int:
        return best_k(self.alpha, self.costs[:self.k_max + 1], self.k_min)

    def update(self, k: int, kept: Sequence[int]) -> None:
        """A step with k drafts kept ``kept[b]`` of them in each (still running) row."""
        self.kept *= self.decay
        self.tried *= self.decay
        for n in kept:
            self.kept += n
            self.tried += n + (n < k)  # the kept ones, and the refused one if the row met one

    def reset(self) -> None:
        self.kept = self.tried = 0.0


def simulate(runs: Sequence[int], costs: Sequence[float], policy: int | AdaptiveK) -> dict[str, float]:
    """Replay a trace (module docstring) with a fixed k (an int) or an :class:`AdaptiveK`: tokens
    emitted after the first (N − 1), time spent (units of ``costs``), tokens per unit of time, steps."""
    _check_costs(costs)
    p = tokens = steps = 0
    time = 0.0
    N = len(runs)  # tokens 0 … N-1 of the sequence; token 0 came with the prefill
    while p < N - 1:
        k = policy if isinstance(policy, int) else policy.choose()
        n = min(k, runs[p], N - 2 - p)  # nothing past the end of the recording
        if not isinstance(policy, int):
            policy.update(k, [n])
        time += costs[k]
        tokens += n + 1
        steps += 1
        p += n + 1
    return {"tokens": tokens, "time": time, "rate": tokens / time if time else 0.0, "steps": steps}
