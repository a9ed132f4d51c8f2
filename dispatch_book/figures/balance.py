"""Figures of chapter 5 (load balance): expert-load histograms, capacity trade-off, training
curves, placement comparison. Each function draws one figure and returns it."""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import NullFormatter, ScalarFormatter

from dispatch_book.figures import SMALL_PT, WIDTH_IN

# The balancing study's settings, in order: colours that differ (not dash styles).
STUDY_COLORS = ("#7f7f7f", "#1f77b4", "#2ca02c", "#d62728", "#9467bd", "#ff7f0e")


def load_histograms(counts_LE: torch.Tensor, title: str = "Expert load per layer", max_layers: int = 8):
    """One bar chart per layer: tokens of each expert / mean (1.0 = perfectly balanced).

    More than ``max_layers`` layers: an evenly spaced selection of them (titled by layer index)."""
    step = max(1, -(-counts_LE.shape[0] // max_layers))
    names = list(range(0, counts_LE.shape[0], step))
    counts_LE = counts_LE[names]
    L, E = counts_LE.shape
    cols = min(L, 4)
    rows = (L + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(min(3.2 * cols, WIDTH_IN), 2.4 * rows), squeeze=False, sharey=True)
    for layer in range(L):
        ax = axes[layer // cols][layer % cols]
        c = counts_LE[layer].double()
        ax.bar(range(E), (c / c.mean()).tolist(), color="tab:blue")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_title(f"layer {names[layer]}", fontsize=SMALL_PT)
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
    top = 0.0  # the largest increase drawn: the axis stops at the first tick 1.5x above it
    for rows, label, marker, dy, col in ((ours, "ours", "o", 8, "#d62728"),
                                         (anchor or [], anchor_label, "s", -14, "#1f77b4")):
        if not rows:
            continue
        base = rows[0]["ppl"]
        pts = [(100 * r["dropped"], 100 * (r["ppl"] / base - 1)) for r in rows]
        ax.plot(*zip(*pts, strict=True), marker=marker, label=label, color=col)
        top = max(top, *(y for _, y in pts))
        groups = {}
        for r, (x, y) in zip(rows, pts, strict=True):
            cf = "dropless" if r["capacity_factor"] is None else f"CF {r['capacity_factor']}"
            groups.setdefault((round(x, 1), round(y, 1)), []).append(cf)
        for j, ((x, y), names) in enumerate(groups.items()):
            ax.annotate(", ".join(names), (x, y), fontsize=SMALL_PT, color=col, textcoords="offset points",
                        xytext=(4, dy + (10 if dy > 0 and j % 2 else 0)))
    ax.set_xlabel("routed (token, expert) pairs dropped (%)")
    ax.set_ylabel("perplexity increase over dropless (%)")
    ax.set_yscale("symlog", linthresh=1)
    ticks = [0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    last = next((t for t in ticks if t >= 1.5 * top), ticks[-1])  # room above for the top label
    ax.set_yticks([t for t in ticks if t <= last])
    ax.set_ylim(top=last)
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=SMALL_PT, loc="upper left")
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


def training_curves(rows: list[dict]):
    """Load imbalance (busiest / mean, mean over layers) and validation perplexity over training:
    one faint line per seed, the mean over seeds drawn bold, one colour per setting.

    ``rows``: the balancing study's rows (``label``, ``seed``, ``curves`` with ``step``,
    ``imbalance``, ``eval_step``, ``eval_ppl``)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.8))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    for i, label in enumerate(labels):
        col = STUDY_COLORS[i % len(STUDY_COLORS)]
        runs = [r["curves"] for r in rows if r["label"] == label]
        for ax, x, y in ((a, "step", "imbalance"), (b, "eval_step", "eval_ppl")):
            for c in runs:
                ax.plot(c[x], c[y], color=col, lw=0.8, alpha=0.35)
            mean = [sum(v) / len(v) for v in zip(*(c[y] for c in runs), strict=True)]
            ax.plot(runs[0][x], mean, color=col, lw=2, label=f"{label} ({len(runs)} seeds)")
    a.axhline(1.0, color="k", lw=0.8, ls="--")
    a.set_xlabel("step")
    a.set_ylabel("busiest expert / mean")
    a.set_title("Load imbalance during training")
    b.set_xlabel("step")
    b.set_ylabel("validation perplexity")
    b.set_yscale("log")
    ppl = [v for r in rows for v in r["curves"]["eval_ppl"]]
    b.set_yticks([t for t in (100, 150, 200, 300, 500, 700, 1000, 2000) if min(ppl) <= t <= max(ppl)]
                 or [min(ppl), max(ppl)])  # labelled ticks inside the range a log axis may skip
    b.yaxis.set_major_formatter(ScalarFormatter())
    b.yaxis.set_minor_formatter(NullFormatter())
    b.set_title("Validation perplexity")
    a.legend(fontsize=SMALL_PT)
    fig.tight_layout()
    return fig


def study_spread(rows: list[dict]):
    """The study's final validation imbalance and perplexity: one dot per seed for each setting,
    the mean as a bar across them, and a faint line joining each seed's runs (the settings of one
    seed share the initial weights and the batches, so a seed's line is a paired comparison).

    ``rows``: the balancing study's rows (``label``, ``seed``, ``final``)."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    seeds = sorted({r["seed"] for r in rows})
    for ax, key, name in ((axes[0], "imbalance", "busiest expert / mean"),
                          (axes[1], "val_ppl", "validation perplexity")):
        val = {(r["label"], r["seed"]): r["final"][key] for r in rows}
        for s in seeds:
            xs = [i for i, lb in enumerate(labels) if (lb, s) in val]
            ax.plot(xs, [val[labels[i], s] for i in xs], color="k", lw=0.6, alpha=0.25)
        for i, lb in enumerate(labels):
            v = [val[lb, s] for s in seeds if (lb, s) in val]
            col = STUDY_COLORS[i % len(STUDY_COLORS)]
            ax.scatter([i] * len(v), v, color=col, s=28, zorder=3)
            ax.hlines(sum(v) / len(v), i - 0.25, i + 0.25, color=col, lw=2.5, zorder=2)
        ax.set_xticks(range(len(labels)), [lb.replace(" (", "\n(") for lb in labels], fontsize=SMALL_PT)
        ax.set_ylabel(name)
        ax.grid(axis="y", alpha=0.3)
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set_title("Validation imbalance, each seed")
    axes[1].set_title("Validation perplexity, each seed")
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
    ax.legend(fontsize=SMALL_PT, loc="upper left")
    fig.tight_layout()
    return fig
