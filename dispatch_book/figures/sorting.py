"""Chapter 1's figures: the expert-sorted, block-padded layout; the sort kernel's block tiling;
and the routing + sort benchmark (ours vs the PyTorch twins)."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.colors import ListedColormap

from dispatch_book.figures import SMALL_PT, WIDTH_IN, color

PAD_COLOR, UNUSED_COLOR = "#d9d9d9", "#ffffff"


def _expert_colors(E: int):
    """Distinct colours, greys left out (grey means padding): tab20's dark shades, then its light ones."""
    base = plt.get_cmap("tab20")
    order = [i for i in list(range(0, 20, 2)) + list(range(1, 20, 2)) if i not in (14, 15)]
    return [base(order[e % len(order)]) for e in range(E)]


def sorted_layout(routes, ids_TK: torch.Tensor, *, title: str = ""):
    """The P slots as B rows of ``block_m`` cells: colour = expert, grey = padding, white = unused.

    Each filled cell is labelled with its routed row n = t·K + k. ``routes`` is a SortedRoutes.
    """
    rows_P = routes.sorted_rows_P.cpu().numpy()
    ids_N = ids_TK.reshape(-1).cpu().numpy()
    B, bm, N, E = routes.max_blocks, routes.block_m, routes.num_rows, routes.num_experts
    used = int(routes.num_blocks_1.item())
    code = np.full(B * bm, E + 1)  # E + 1: unused block
    code[: used * bm] = E  # E: padding inside a used block
    real = rows_P < N
    code[real] = ids_N[rows_P[real]]
    cmap = ListedColormap(_expert_colors(E) + [PAD_COLOR, UNUSED_COLOR])
    fig, ax = plt.subplots(figsize=(min(0.42 * bm + 2.4, 9), 0.45 * max(B, 1) + 1.2), constrained_layout=True)
    ax.imshow(code.reshape(B, bm), cmap=cmap, vmin=-0.5, vmax=E + 1.5, aspect="auto", interpolation="nearest")
    for s in np.flatnonzero(real):
        ax.text(s % bm, s // bm, str(rows_P[s]), ha="center", va="center", fontsize=SMALL_PT)
    be = routes.block_expert_B.cpu().tolist()
    ax.set_yticks(range(B))
    ax.set_yticklabels([f"block {b}: expert {e}" if e >= 0 else f"block {b}: unused" for b, e in enumerate(be)],
                       fontsize=SMALL_PT)
    ax.set_xticks(range(0, bm, max(1, bm // 8)))
    ax.set_xlabel(f"slot within the block (block_m = {bm})")
    ax.set_xticks(np.arange(-0.5, bm, 1), minor=True)
    ax.set_yticks(np.arange(-0.5, B, 1), minor=True)
    ax.grid(which="minor", color="white", lw=0.6)
    ax.tick_params(which="minor", length=0)
    ax.set_title(title or f"{N} routed rows in {used} used blocks of {B} allocated (grey: padding)", fontsize=10)
    return fig


def block_histograms(ids_TK: torch.Tensor, num_experts: int, block_n: int):
    """What the sort's first two kernels compute: per-block counts hist[NB, E] and the exclusive
    scan down the blocks before[NB, E] (as numpy arrays)."""
    ids_N = ids_TK.reshape(-1).long().cpu()
    NB = -(-ids_N.numel() // block_n)
    hist = torch.zeros(NB, num_experts, dtype=torch.long)
    for b in range(NB):
        hist[b] = torch.bincount(ids_N[b * block_n:(b + 1) * block_n], minlength=num_experts)
    return hist.numpy(), (hist.cumsum(0) - hist).numpy()


def block_scan_figure(ids_TK: torch.Tensor, num_experts: int, block_n: int):
    """The sort's tiling: the routed rows cut into programs of ``block_n`` rows; each program's
    histogram (kernel 1), then the running count before it per expert (kernel 2)."""
    hist, before = block_histograms(ids_TK, num_experts, block_n)
    N = ids_TK.numel()
    fig, axes = plt.subplots(1, 2, figsize=(min(1.2 + 0.7 * num_experts, 9), 0.5 * len(hist) + 1.6),
                             constrained_layout=True)
    for ax, mat, name in zip(axes, (hist, before), ("kernel 1: hist[b, e]", "kernel 2: before[b, e]"),
                             strict=True):
        ax.imshow(mat, cmap="Blues", aspect="auto", vmin=0, vmax=max(int(mat.max()), 1) * 1.6)
        for (b, e), v in np.ndenumerate(mat):
            ax.text(e, b, str(v), ha="center", va="center", fontsize=SMALL_PT)
        ax.set_xticks(range(num_experts))
        ax.set_yticks(range(len(mat)))
        labels = [f"rows {b * block_n}–{min((b + 1) * block_n, N) - 1}" for b in range(len(mat))]
        ax.set_yticklabels(labels, fontsize=SMALL_PT)
        ax.set_xlabel("expert e")
        ax.set_title(name, fontsize=10)
    return fig


def routing_sort_figure(doc: dict, ops=("route", "sort")):
    """Median time vs tokens, one panel per layer shape: ours (red) vs the PyTorch twin (purple);
    solid = route, dashed = sort, dotted = both. On a GPU recording the times are CUDA-graph replays
    (the kernels alone); a CPU run's are the wall clock. ``doc`` is a ``routing_sort.json`` document."""
    rows = doc["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(min(3.1 * len(shapes), WIDTH_IN), 4.2), squeeze=False,
                             constrained_layout=True, sharey=True)
    for ax, shape in zip(axes[0], shapes, strict=False):
        for op, ls in zip(ops, ("-", "--", ":")[:len(ops)], strict=True):
            for impl in ("ours", "torch"):
                pts = sorted((r["T"], r["median_ms"] * 1e3) for r in rows
                             if r["shape"] == shape and r["op"] == op and r["impl"] == impl)
                if pts:
                    ax.plot(*zip(*pts, strict=True), ls=ls, marker="o", ms=3, color=color(impl), label=f"{op}: {impl}")
        r0 = next(r for r in rows if r["shape"] == shape)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{shape}: E={r0['E']}, K={r0['K']}", fontsize=10)
        ax.set_xlabel("tokens T")
        ax.grid(True, which="both", alpha=0.3)
    graph = all(r.get("graph") for r in rows)
    axes[0][0].set_ylabel("µs per call, CUDA graph" if graph else "µs per call (wall clock)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, fontsize=SMALL_PT)
    fig.suptitle(f"routing and sort on {doc['gpu']} ({rows[0].get('dtype', '')} logits, "
                 f"block_m={rows[0].get('block_m', '?')})", fontsize=11)
    return fig


def eager_sum(doc: dict) -> dict:
    """Does route + sort cost route plus sort? Medians over the recorded (shape, T) cases of ours: the
    chain's time over the sum of its parts' from a CUDA graph (``graph``), in the host's time to issue
    them (``host``) and eagerly as ``do_bench`` times them (``eager``); and ``hidden_us``, the host time
    an eager call's timing does not show (host µs − (eager − graph) µs), median over every op."""
    import statistics

    ours = {(r["shape"], r["T"], r["op"]): r for r in doc["rows"] if r["impl"] == "ours"}
    cases = sorted({(s, T) for s, T, _ in ours})

    def ratio(field):
        return statistics.median(ours[s, T, "route+sort"][field] / (ours[s, T, "route"][field]
                                 + ours[s, T, "sort"][field]) for s, T in cases)

    hidden = [r["host_us"] - (r["eager_ms"] - r["median_ms"]) * 1e3 for r in ours.values()]
    return {"cases": len(cases), "graph": ratio("median_ms"), "host": ratio("host_us"),
            "eager": ratio("eager_ms"), "hidden_us": statistics.median(hidden)}
