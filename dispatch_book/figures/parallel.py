"""Chapter 4's figures: which rank holds which expert, how many rows each rank sends to each
other, and the recorded/live dispatch-combine and layer timings.

The drawing functions return the figure; the notebook cell calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from dispatch_book.figures import SMALL_PT, WIDTH_IN, color


def placement_map(placement, load_E=None, *, title: str = ""):
    """Rank × expert grid (a filled cell = the rank holds that expert; darker = replicated), with
    the rows each rank computes as bars when ``load_E`` is given."""
    R, E = placement.num_ranks, placement.num_experts
    held = np.zeros((R, E))
    for r, row in enumerate(placement.slots_RS):
        held[r, list(row)] = 1
    held *= held.sum(0, keepdims=True)  # 1 = sole owner, 2+ = one of several replicas
    ncols = 2 if load_E is not None else 1
    fig, axes = plt.subplots(1, ncols, figsize=(3 + 0.35 * E + 2.5 * (ncols - 1), 0.5 + 0.45 * R),
                             gridspec_kw={"width_ratios": [E, 6][:ncols]}, squeeze=False)
    ax = axes[0, 0]
    ax.imshow(held, cmap="Blues", vmin=0, vmax=max(2.5, held.max() + 0.5), aspect="auto")
    for r in range(R):
        for e in range(E):
            if held[r, e]:
                ax.text(e, r, str(e), ha="center", va="center", fontsize=SMALL_PT)
    ax.set_xticks(range(E))
    ax.set_yticks(range(R), [f"rank {r}" for r in range(R)])
    ax.set_xlabel("expert")
    ax.set_title(title or "placement (darker: replicated)")
    if load_E is not None:
        loads = placement.rank_loads(load_E)
        axes[0, 1].barh(range(R), loads, color=color("ours"))
        axes[0, 1].invert_yaxis()
        axes[0, 1].set_yticks([])
        axes[0, 1].set_xlabel("rows computed")
    fig.tight_layout()
    return fig


def send_matrix(counts_RR, *, title: str = "rows sent (source → destination)"):
    """Heatmap of counts_RR[s][d] = routed rows rank s sends to rank d (diagonal: stays home)."""
    c = np.asarray(counts_RR)
    R = c.shape[0]
    fig, ax = plt.subplots(figsize=(1.2 + 0.6 * R, 1.0 + 0.5 * R))
    ax.imshow(c, cmap="Oranges", aspect="auto")
    for s in range(R):
        for d in range(R):
            ax.text(d, s, str(int(c[s, d])), ha="center", va="center", fontsize=8)
    ax.set_xticks(range(R))
    ax.set_yticks(range(R))
    ax.set_xlabel("destination rank")
    ax.set_ylabel("source rank")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


STYLE = {  # contestant -> (colour key, line style, label); older recordings' names included
    "nccl_all_to_all": ("nccl", ":", "NCCL all_to_all_single of every (token, expert) pair, one way"),
    "nccl_dispatch_combine": ("nccl", "-", "NCCL dispatch + combine (exact splits)"),
    "nccl_dispatch_combine_graph": ("nccl_graph", "--", "NCCL dispatch + combine (fixed capacity, CUDA graph)"),
    "p2p_round_trip": ("p2p", "--", "peer-to-peer round trip (eager)"),
    "p2p_round_trip_graph": ("p2p_graph", "-", "peer-to-peer round trip (CUDA graph)"),
    "p2p_dispatch_combine": ("p2p", "--", "peer-to-peer dispatch + combine (eager)"),
    "p2p_dispatch_combine_graph": ("p2p_graph", "-", "peer-to-peer dispatch + combine (CUDA graph)"),
    "ep_nccl": ("nccl", "-", "expert parallel (NCCL)"),
    "ep_nccl_graph": ("nccl_graph", "--", "expert parallel (NCCL, fixed capacity, CUDA graph)"),
    "ep_p2p": ("p2p", "-", "expert parallel (peer-to-peer)"),
    "ep_p2p_graph": ("p2p_graph", "-", "expert parallel (peer-to-peer, CUDA graph)"),
    "one_gpu": ("torch", "--", "one GPU, whole batch, same kernels"),
    "one_gpu_auto": ("torch", ":", "one GPU, whole batch, default path"),
    "single_gpu": ("torch", "--", "one GPU, whole batch")}


GRAPH_COLORS = {"nccl_graph": "#17becf", "p2p_graph": "#ff7f0e"}  # a CUDA-graph variant's own colour


def ms(row: dict) -> float:
    """A row's median in milliseconds (older recordings stored microseconds)."""
    return row["median_ms"] if "median_ms" in row else row["median_us"] / 1e3


def expert_parallel_timings(doc: dict):
    """Two panels from a results doc: the exchange, and the routed experts / whole layer, vs tokens/GPU."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.4))  # the book's widest
    for ax, kind in zip(axes, ("exchange", "layer"), strict=True):
        by = {}
        for row in doc["rows"]:
            if row.get("kind") == kind:
                by.setdefault(row["contestant"], []).append((row["tokens_per_gpu"], ms(row)))
        for name, pts in by.items():
            pts.sort()
            c, ls, label = STYLE.get(name, ("torch", "-", name))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="s" if "graph" in name else "o",
                    color=GRAPH_COLORS.get(c) or color(c), label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per GPU")
        ax.set_ylabel("ms per call (slowest rank, median)")
        ax.set_title({"exchange": "dispatch + combine", "layer": "MoE experts, EP vs one GPU"}[kind])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=SMALL_PT, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    return fig
