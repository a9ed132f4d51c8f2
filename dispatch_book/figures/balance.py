"""Figures of chapter 5 (load balance): expert-load histograms, capacity trade-off, training
curves, placement comparison. Each function draws one figure and returns it."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullFormatter, ScalarFormatter


def load_histograms(counts_LE: torch.Tensor, title: str = "Expert load per layer", max_layers: int = 8):
    """One bar chart per layer: tokens of each expert / mean (1.0 = perfectly balanced).

    More than ``max_layers`` layers: an evenly spaced selection of them (titled by layer index)."""
    step = max(1, -(-counts_LE.shape[0] // max_layers))
    names = list(range(0, counts_LE.shape[0], step))
    counts_LE = counts_LE[names]
    L, E = counts_LE.shape
    cols = min(L, 4)
    rows = (L + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False, sharey=True)
    for layer in range(L):
        ax = axes[layer // cols][layer % cols]
        c = counts_LE[layer].double()
        ax.bar(range(E), (c / c.mean()).tolist(), color="tab:blue")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(f"layer {names[layer]}", fontsize=9)
        ax.set_xlabel("expert")
    for i in range(L, rows * cols):
        axes[i // cols][i % cols].axis("off")
    axes[0][0].set_ylabel("load / mean")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def capacity_tradeoff(ours: list[dict], anchor: list[dict] | None = None, anchor_label: str = "anchor"):
    """Perplexity relative to dropless against the fraction of routed pairs dropped.

    Rows: ``{"capacity_factor", "dropped", "ppl"}`` (dropless first, capacity_factor None)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for rows, label, marker in ((ours, "ours", "o"), (anchor or [], anchor_label, "s")):
        if not rows:
            continue
        base = rows[0]["ppl"]
        ax.plot([100 * r["dropped"] for r in rows], [r["ppl"] / base for r in rows], marker=marker, label=label)
        for r in rows:
            cf = "dropless" if r["capacity_factor"] is None else f"CF {r['capacity_factor']}"
            ax.annotate(cf, (100 * r["dropped"], r["ppl"] / base), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("routed (token, expert) pairs dropped (%)")
    ax.set_ylabel("perplexity / dropless perplexity")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.legend()
    ax.set_title("What a capacity limit costs at inference")
    fig.tight_layout()
    return fig


def training_curves(runs: dict[str, dict]):
    """Load imbalance (busiest / mean, mean over layers) and validation perplexity over training.

    ``runs``: label → ``curves`` dict of a training log (``step``, ``imbalance``,
    ``eval_step``, ``eval_ppl``)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, c in runs.items():
        a.plot(c["step"], c["imbalance"], label=label)
        b.plot(c["eval_step"], c["eval_ppl"], marker=".", label=label)
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    a.set_xlabel("step")
    a.set_ylabel("busiest expert / mean")
    a.set_title("Load imbalance during training")
    b.set_xlabel("step")
    b.set_ylabel("validation perplexity")
    b.set_yscale("log")
    b.yaxis.set_major_formatter(ScalarFormatter())
    b.yaxis.set_minor_formatter(NullFormatter())
    b.set_title("Validation perplexity")
    a.legend()
    fig.tight_layout()
    return fig


def placement_bars(table: dict[int, dict[str, float]]):
    """Grouped bars: busiest rank / mean rank for each placement (legend) and rank count (x).

    ``table``: ranks → {placement name → max/mean}."""
    ranks = sorted(table)
    names = list(table[ranks[0]])
    fig, ax = plt.subplots(figsize=(6, 3.4))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * w for j in range(len(ranks))], [table[r][n] for r in ranks], width=w, label=n)
    ax.set_xticks([j + w * (len(names) - 1) / 2 for j in range(len(ranks))], [f"{r} ranks" for r in ranks])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylabel("busiest rank / mean rank")
    ax.set_title("Expert placement")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
