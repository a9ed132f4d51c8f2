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
    fig, axes = plt.subplots(rows, cols, figsize=(min(3.2 * cols, 9.4), 2.4 * rows), squeeze=False, sharey=True)
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
    """Perplexity increase over dropless (%, symlog axis) against the fraction of routed pairs dropped.

    Rows: ``{"capacity_factor", "dropped", "ppl"}`` (dropless first, capacity_factor None). Points
    that coincide share one label; ours are labelled above, the anchor's below."""
    fig, ax = plt.subplots(figsize=(8, 4))
    for rows, label, marker, dy, col in ((ours, "ours", "o", 8, "#d62728"),
                                         (anchor or [], anchor_label, "s", -14, "#1f77b4")):
        if not rows:
            continue
        base = rows[0]["ppl"]
        pts = [(100 * r["dropped"], 100 * (r["ppl"] / base - 1)) for r in rows]
        ax.plot(*zip(*pts, strict=True), marker=marker, label=label, color=col)
        groups = {}
        for r, (x, y) in zip(rows, pts, strict=True):
            cf = "dropless" if r["capacity_factor"] is None else f"CF {r['capacity_factor']}"
            groups.setdefault((round(x, 1), round(y, 1)), []).append(cf)
        for j, ((x, y), names) in enumerate(groups.items()):
            ax.annotate(", ".join(names), (x, y), fontsize=9, color=col, textcoords="offset points",
                        xytext=(4, dy + (10 if dy > 0 and j % 2 else 0)))
    ax.set_xlabel("routed (token, expert) pairs dropped (%)")
    ax.set_ylabel("perplexity increase over dropless (%)")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_yticks([0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000])
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")
    ax.set_title("What a capacity limit costs at inference")
    fig.tight_layout()
    return fig


def describe_checkpoint(ck, model: str, dataset: str) -> list[str]:
    """Where a loaded checkpoint came from, and whether this Python's corpus is the one it saw."""
    from dispatch import data

    log, out = ck.log, []
    if not log:
        return out
    out.append(f"trained by `{log['command']}` ({log['config']['steps']} steps, "
               f"balance={log['config']['balance']}) on Python {log['python']}, "
               f"corpus {log['manifest_hash']}, in {log['train_seconds']:.0f} s")
    if dataset == "stdlib":
        here = data.manifest()
        if here["hash"] == log["manifest_hash"]:
            out.append(f"this Python's standard library is the same corpus ({here['hash']}): "
                       "numbers reproduce")
        else:
            out.append(f"NOTE: this Python ({here['python']}) has another standard library (corpus "
                       f"{here['hash']}) than the checkpoint's ({log['python']}, {log['manifest_hash']}): "
                       "the numbers below will differ from the book's; retrain=True trains on this one.")
    return out


def training_curves(runs: dict[str, dict]):
    """Load imbalance (busiest / mean, mean over layers) and validation perplexity over training.

    ``runs``: label → ``curves`` dict of a training log (``step``, ``imbalance``,
    ``eval_step``, ``eval_ppl``)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.4, 3.6))
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
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.8 / len(names)
    for i, n in enumerate(names):
        ax.bar([j + i * w for j in range(len(ranks))], [table[r][n] for r in ranks], width=w, label=n)
    ax.set_xticks([j + w * (len(names) - 1) / 2 for j in range(len(ranks))], [f"{r} ranks" for r in ranks])
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_ylabel("busiest rank / mean rank")
    ax.set_title("Expert placement")
    ax.set_ylim(0.9, max(max(row.values()) for row in table.values()) * 1.05)
    ax.legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    return fig
