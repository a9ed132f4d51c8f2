"""Chapter 2's figures: how the grouped GEMM tiles sorted rows, and the TFLOP/s it reaches."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dispatch_book.figures import color

LABELS = {"ours_grouped": "ours (grouped GEMM)", "ours_decode": "ours (decode kernels)",
          "ours_layer": "ours, whole layer (router+sort)", "hf_eager": "transformers eager",
          "hf_grouped_mm": "transformers grouped_mm", "hf_batched_mm": "transformers batched_mm"}
STYLE = {"ours_grouped": ("ours", "-"), "ours_decode": ("ours", ":"), "ours_layer": ("ours", "--"),
         "hf_eager": ("eager", "-"), "hf_grouped_mm": ("grouped_mm", "-"), "hf_batched_mm": ("batched_mm", "-")}


def tiling(routes, n_cols: int, block_n: int, *, title: str = "up kernel grid", max_blocks: int = 16,
           max_tiles: int = 16):
    """Left: sorted slots (rows) coloured by expert, padding hatched. Right: the launch grid —
    one program per (block of block_m slots, column tile); a block never mixes experts.

    A picture of a few blocks: at most ``max_blocks`` used blocks and ``max_tiles`` column tiles are
    drawn (the first ones; the titles keep the full counts), so a GPU-sized layer stays readable."""
    rows = routes.sorted_rows_P.tolist()
    be = routes.block_expert_B.tolist()
    P, B = len(rows), len(be)
    bm, N = P // B, routes.slot_of_N.numel()
    used_all = sum(e >= 0 for e in be)
    tiles_all = -(-n_cols // block_n)
    used, n_tiles = min(used_all, max_blocks), min(tiles_all, max_tiles)
    cmap = plt.get_cmap("tab20")
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 4.2), gridspec_kw={"width_ratios": [1.4, 1.2]})
    for s in range(used * bm):
        e = be[s // bm]
        pad = rows[s] >= N
        a0.add_patch(Rectangle((0, P - 1 - s), 1, 1, fc="white" if pad else cmap(e % 20), lw=0,
                               hatch="///" if pad else None))
    for b in range(used):
        a0.axhline(P - b * bm, color="k", lw=1)
        ns = [n for n in rows[b * bm:(b + 1) * bm] if n < N]
        shown = ", ".join(map(str, ns[:5])) + (", ..." if len(ns) > 5 else "")
        a0.text(1.05, P - b * bm - bm / 2, f"block {b}: e{be[b]}, rows n = {shown}", va="center", fontsize=7)
    a0.set(xlim=(0, 3.2), ylim=(P - used * bm, P), xticks=[], yticks=[],
           title=f"sorted slots (block_m={bm}), padding hatched")
    for b in range(used):
        for j in range(n_tiles):
            a1.add_patch(Rectangle((j, used - 1 - b), 0.94, 0.94, fc=cmap(be[b] % 20), alpha=0.85))
            a1.text(j + 0.47, used - 0.53 - b, f"({b},{j})", ha="center", va="center", fontsize=6)
    drawn = "" if (used, n_tiles) == (used_all, tiles_all) else f"\n(first {used} × {n_tiles} drawn)"
    a1.set(xlim=(0, n_tiles), ylim=(0, used), xticks=[], yticks=[], xlabel=f"column tile ({block_n} wide)",
           ylabel="block of sorted rows",
           title=f"{title}: {used_all} × {tiles_all} programs (+{B - used_all} idle){drawn}")
    fig.tight_layout()
    return fig


def throughput(doc: dict, peak_flops: float, shapes=None, contestants=None, *,
               peak_label: str = "measured bf16 peak"):
    """TFLOP/s vs tokens, one panel per shape, one line per contestant, the bf16 ceiling
    ``peak_flops`` (FLOP/s, labelled ``peak_label``) on top."""
    rows = doc["rows"]
    shapes = shapes or list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.3 * len(shapes), 3.8), squeeze=False, sharey=True)
    for ax, shape in zip(axes[0], shapes, strict=False):
        rs = [r for r in rows if r["shape"] == shape and "tflops" in r]
        names = contestants or list(dict.fromkeys(r["contestant"] for r in rs))
        for name in names:
            pts = sorted((r["tokens"], r["tflops"]) for r in rs if r["contestant"] == name)
            if pts:
                base, ls = STYLE.get(name, (name, "-"))
                ax.plot(*zip(*pts, strict=False), marker="o", ms=3, ls=ls, color=color(base),
                        label=LABELS.get(name, name))
        ax.axhline(peak_flops / 1e12, color=color("ceiling"), lw=1)
        ax.text(1, peak_flops / 1e12 * 1.1, f"{peak_label} ({peak_flops / 1e12:.0f} TFLOP/s)", fontsize=7)
        ax.set(xscale="log", yscale="log", title=shape, xlabel="tokens")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("TFLOP/s (expert GEMMs)")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def sweep(doc: dict, shape: str, tokens: int):
    """Bars: TFLOP/s of each pinned tile config (BLOCK_M, N, K, warps, stages), up and down kernels."""
    rs = [r for r in doc["rows"] if r["shape"] == shape and r["tokens"] == tokens and "tflops" in r
          and r["kernel"] in ("up", "down")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, kind in zip(axes, ("up", "down"), strict=False):
        sel = [r for r in rs if r["kernel"] == kind]
        ax.barh(range(len(sel)), [r["tflops"] for r in sel], color=color("ours"))
        ax.set_yticks(range(len(sel)), ["×".join(map(str, r["config"])) for r in sel], fontsize=7)
        ax.set(title=f"{kind} kernel, {shape}, T={tokens}", xlabel="TFLOP/s")
    axes[0].set_ylabel("BLOCK_M×N×K×warps×stages")
    fig.tight_layout()
    return fig
