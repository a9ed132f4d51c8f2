"""The book's figures: one module per chapter (``routing``, ``triton``, ``sorting``, ``gemm``, ``decode``,
``parallel``, ``balance``, ``engine``), sharing the few conventions below."""
from __future__ import annotations

# One palette for contestants across every chapter's benchmark figures.
COLORS = {
    "ours": "#d62728",
    "ours_decode": "#ff7f0e",
    "ours_layer": "#8c564b",
    "dispatch": "#d62728",
    "eager": "#7f7f7f",
    "grouped_mm": "#1f77b4",
    "batched_mm": "#2ca02c",
    "torch": "#9467bd",
    "nccl": "#1f77b4",
    "p2p": "#d62728",
    "ceiling": "#000000",
}


def color(name: str) -> str:
    """A contestant's colour (a stable fallback for unknown names)."""
    palette = ["#8c564b", "#e377c2", "#bcbd22", "#17becf", "#ff7f0e"]
    return COLORS.get(name, palette[sum(map(ord, name)) % len(palette)])


def finish_grid(fig, axes, used: int, ylabel: str):
    """A grid of panels, one per shape: the y label on the first column, unused panels hidden, and
    one legend for all panels below them (taken from the first panel). Returns ``fig``."""
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in axes.flat[used:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.12 / axes.shape[0], 1, 1))
    return fig
