"""Chapter 3's figures: how the decode kernels tile the work, and the bandwidth they reach."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dispatch.arithmetic import H200_HBM_BPS
from dispatch_book.figures import color

LABELS = {"ours": "ours (moe_decode)", "ours_graph": "ours, CUDA graph", "ours_wide": "ours, wide tiles",
          "batched_mm": "transformers batched_mm", "grouped_mm": "transformers grouped_mm",
          "loop": "per-expert torch loop"}


def tiling(ids_TK, num_experts: int, I: int, block_i: int, *, H: int | None = None, block_ho: int | None = None):  # noqa: E741
    """Left: the routing table coloured by expert. Right: the up kernel's grid — one column per
    used expert (a "slot"), cut into I/block_i tiles; every tile is one program that streams its
    gate/up rows once and applies them to all of that expert's rows."""
    T, K = ids_TK.shape
    used = sorted(set(ids_TK.flatten().tolist()))
    cmap = plt.get_cmap("tab20")
    n_tiles = -(-I // block_i)
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [1, 2.2]})
    for t in range(T):
        for k in range(K):
            e = int(ids_TK[t, k])
            a0.add_patch(Rectangle((k, T - 1 - t), 1, 1, color=cmap(e % 20), ec="white"))
            a0.text(k + 0.5, T - 0.5 - t, str(e), ha="center", va="center", fontsize=8)
    a0.set(xlim=(0, K), ylim=(0, T), xticks=[k + 0.5 for k in range(K)], xticklabels=range(K),
           yticks=[T - 0.5 - t for t in range(T)], yticklabels=range(T), xlabel="k", ylabel="token t",
           title="ids_TK (expert of each routed row)")
    for s, e in enumerate(used):
        rows = [t * K + k for t in range(T) for k in range(K) if int(ids_TK[t, k]) == e]
        for i in range(n_tiles):
            a1.add_patch(Rectangle((s, n_tiles - 1 - i), 0.92, 0.92, color=cmap(e % 20), alpha=0.85))
        label = f"e{e}\nrows {rows}" if len(used) <= 12 else f"e{e}"  # many slots: no room for the rows
        a1.text(s + 0.46, n_tiles + 0.2, label, ha="center", va="bottom", fontsize=7 if len(used) <= 12 else 6)
    room = max(1.6, 0.15 * n_tiles)  # above the tiles, for the labels (in tile units)
    a1.set(xlim=(-0.2, len(used)), ylim=(0, n_tiles + room), xticks=[], yticks=[],
           xlabel=f"slot = used expert ({len(used)} of {num_experts})",
           ylabel=f"I tile ({n_tiles} × {block_i} rows of gate and up)",
           title=f"up kernel grid: {len(used)} × {n_tiles} = {len(used) * n_tiles} programs")
    for side in ("top", "right"):
        a1.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def bandwidth(doc: dict, hbm_bps: float = H200_HBM_BPS, *, hbm_label: str = "HBM"):
    """GB/s on the distinct chosen experts' bytes vs tokens, one panel per shape; the HBM ceiling
    ``hbm_bps`` (bytes/s, labelled ``hbm_label``) and 80% of it drawn on top."""
    shapes = list(dict.fromkeys(r["shape"] for r in doc["rows"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.6 * len(shapes), 3.8), squeeze=False, sharey=True)
    for ax, shape in zip(axes[0], shapes, strict=False):
        rows = [r for r in doc["rows"] if r["shape"] == shape]
        names = list(dict.fromkeys(n for r in rows for n in r["contestants"]))
        for name in names:
            pts = [(r["tokens"], r["contestants"][name]["gbps"]) for r in rows
                   if "gbps" in r["contestants"].get(name, {})]
            if pts:
                base = name.split("_")[0] if name.startswith("ours") else name
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=LABELS.get(name, name), color=color(base),
                        ls={"ours_graph": "--", "ours_wide": ":"}.get(name, "-"))
        ax.axhline(hbm_bps / 1e9, color=color("ceiling"), lw=1)
        ax.axhline(0.8 * hbm_bps / 1e9, color=color("ceiling"), lw=0.8, ls=":")
        ax.text(1, hbm_bps / 1e9 * 1.02, f"{hbm_label} {hbm_bps / 1e12:.2f} TB/s (80% dotted)", fontsize=7,
                va="bottom")
        ax.set(xscale="log", xlabel="tokens", title=shape, ylim=(0, 1.12 * hbm_bps / 1e9))
        ax.set_xticks([r["tokens"] for r in rows], [str(r["tokens"]) for r in rows])
    axes[0][0].set_ylabel("GB/s of expert weights read")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
