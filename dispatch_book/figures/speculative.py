"""Chapter 9's figures: the experts a verify step touches, its price against k, what each k buys,
and the race. Each drawing function returns the figure; the notebook cell calls ``plt.show()``."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from dispatch.arithmetic import expected_unique_experts, expected_unique_experts_skewed
from dispatch.serve.spec_cost import AdaptiveK, simulate


def experts_touched(routing: dict, title: str):
    """Distinct experts per layer against the tokens of one step (w = k + 1), from a traces
    recording's ``routing``: independent uniform routing (the formula), independent tokens with the
    measured expert shares (skew), and the measured consecutive tokens of real text."""
    w, E, K = routing["windows"], routing["E"], routing["K"]
    inc = torch.tensor(routing["inclusion_LE"], dtype=torch.float64)
    skew = [sum(expected_unique_experts_skewed(p, t) for p in inc) / len(inc) for t in w]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.plot(w, [expected_unique_experts(E, K, t) for t in w], "k--", label=f"E(1 - (1 - K/E)^w), E={E}, K={K}")
    ax.plot(w, skew, ":", color="#1f77b4", marker="s", label="independent tokens, measured expert shares")
    ax.plot(w, routing["measured"], "-", color="#d62728", marker="o", lw=2, label="consecutive tokens of real text")
    ax.set(xlabel="tokens in the step (w = k + 1)", ylabel="distinct experts per layer", title=title, ylim=(0, E))
    ax.set_xticks(w)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def price_curve(measured: dict[str, list[float]], predicted: dict[str, list[float]] | None = None,
                title: str = ""):
    """A step's time with k drafts over its time with none (k = 0, 1, …) for each named curve,
    solid with dots; ``predicted`` (the byte model: bytes(k) / bytes(0)) dashed."""
    if not measured:
        raise ValueError("price_curve() needs at least one measured curve")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, c) in enumerate(measured.items()):
        ax.plot(range(len(c)), [v / c[0] for v in c], "-o", color=f"C{i}", label=f"{name} (measured)")
        if predicted and name in predicted:
            p = predicted[name]
            ax.plot(range(len(p)), [v / p[0] for v in p], "--", color=f"C{i}", label=f"{name} (bytes read)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="drafts verified per step (k)", ylabel="step time / decode step time", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def payoff(runs: dict[str, list[list[int]]], costs: dict[str, list[float]], plain: float, title: str = ""):
    """Speed-up over plain decoding (one step of time ``plain`` per token) against a fixed k, each
    drafter's traces replayed on its costs (:func:`dispatch.serve.spec_cost.simulate`); the adaptive
    k's speed-up as a dotted line of the drafter's colour. Returns (fig, {name: {k or "adaptive": x}})."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    table = {}
    for i, (name, traces) in enumerate(runs.items()):
        c = costs[name]
        ks = [k for k in range(len(c)) if c[k] is not None]
        filled = [v if v is not None else c[ks[0]] for v in c]  # never taken: below the drafter's k_min
        table[name] = {k: _speedup(traces, filled, k, plain) for k in ks}
        table[name]["adaptive"] = _speedup(traces, filled, AdaptiveK(filled, k_min=ks[0]), plain)
        ax.plot(ks, [table[name][k] for k in ks], "-o", color=f"C{i}", label=f"{name}, fixed k")
        ax.axhline(table[name]["adaptive"], ls=":", color=f"C{i}", label=f"{name}, adaptive k")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="drafts per step (k)", ylabel="speed-up over plain decoding", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, table


def _speedup(traces: list[list[int]], costs: list[float], policy, plain: float) -> float:
    """Tokens per unit of time over a whole set of traces, times the plain step's time."""
    parts = []
    for r in traces:  # each trace a generation of its own: the adaptive k starts afresh
        if isinstance(policy, AdaptiveK):
            policy.reset()
        parts.append(simulate(r, costs, policy))
    return sum(p["tokens"] for p in parts) / sum(p["time"] for p in parts) * plain


def race(rates: dict[str, float], title: str, baseline: str = "plain"):
    """Tokens/s of each contestant as horizontal bars, annotated with its speed-up over ``baseline``."""
    if baseline not in rates:
        raise ValueError(f"race() needs the baseline {baseline!r} among {list(rates)}")
    names = list(rates)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(names) + 1.2))
    bars = ax.barh(range(len(names)), [rates[n] for n in names], color=[f"C{i}" for i in range(len(names))])
    for bar, n in zip(bars, names, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {rates[n] / rates[baseline]:.2f}x",
                va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="tokens/s (batch 1)", title=title)
    ax.set_xlim(0, max(rates.values()) * 1.2)
    fig.tight_layout()
    return fig
