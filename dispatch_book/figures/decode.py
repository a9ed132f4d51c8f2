"""Chapter 3's figures: how the decode kernels tile the work, and the bandwidth they reach."""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dispatch_book.figures import SMALL_PT, WIDTH_IN, color, finish_grid, fits

LABELS = {"ours": "ours (moe_decode)", "ours_graph": "ours, CUDA graph", "ours_wide": "ours, wide tiles",
          "batched_mm": "transformers batched_mm", "grouped_mm": "transformers grouped_mm",
          "loop": "per-expert torch loop", "stream_graph": "plain read of the same bytes"}


def tiling(ids_TK, num_experts: int, I: int, block_i: int, *, H: int | None = None, block_ho: int | None = None):  # noqa: E741
    """Left: the routing table coloured by expert. Right: the up kernel's work — one column per
    used expert (a "slot"), cut into I/block_i tiles; every tile is one item, dealt to the programs
    round-robin, that streams its gate/up rows once and applies them to all of that expert's rows."""
    T, K = ids_TK.shape
    used = sorted(set(ids_TK.flatten().tolist()))
    cmap = plt.get_cmap("tab20")
    n_tiles = -(-I // block_i)
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.8), gridspec_kw={"width_ratios": [1, 2.2]})
    for t in range(T):
        for k in range(K):
            e = int(ids_TK[t, k])
            a0.add_patch(Rectangle((k, T - 1 - t), 1, 1, color=cmap(e % 20), ec="white"))
            a0.text(k + 0.5, T - 0.5 - t, str(e), ha="center", va="center", fontsize=SMALL_PT)
    a0.set(xlim=(0, K), ylim=(0, T), xticks=[k + 0.5 for k in range(K)], xticklabels=range(K),
           yticks=[T - 0.5 - t for t in range(T)], yticklabels=range(T), xlabel="k", ylabel="token t",
           title="ids_TK (expert of each routed row)")
    slot_in = 0.8 * WIDTH_IN * 2.2 / 3.2 / len(used)  # a slot's width in the figure, inches
    rows_of = {e: [t * K + k for t in range(T) for k in range(K) if int(ids_TK[t, k]) == e] for e in used}
    with_rows = all(fits(f"rows {rows_of[e]}", slot_in) for e in used)  # else the experts only
    every = next(n for n in range(1, len(used) + 1) if fits(f"e{max(used)}", n * slot_in))  # many: every few
    for s, e in enumerate(used):
        for i in range(n_tiles):
            a1.add_patch(Rectangle((s, n_tiles - 1 - i), 0.92, 0.92, color=cmap(e % 20), alpha=0.85))
        if s % every == 0:
            label = f"e{e}\nrows {rows_of[e]}" if with_rows else f"e{e}"
            a1.text(s + 0.46, n_tiles + 0.2, label, ha="center", va="bottom", fontsize=SMALL_PT)
    room = max(1.6, 0.15 * n_tiles)  # above the tiles, for the labels (in tile units)
    a1.set(xlim=(-0.2, len(used)), ylim=(0, n_tiles + room), xticks=[], yticks=[],
           xlabel=f"slot = used expert ({len(used)} of {num_experts})",
           ylabel=f"I tile ({n_tiles} × {block_i} rows of gate and up)",
           title=f"up kernel: {len(used)} × {n_tiles} = {len(used) * n_tiles} (expert, tile) items")
    for side in ("top", "right"):
        a1.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def bandwidth(doc: dict, hbm_bps: float, *, hbm_label: str = "HBM"):
    """GB/s on the distinct chosen experts' bytes vs tokens, one panel per shape (a full-width
    grid); the HBM ceiling ``hbm_bps`` (bytes/s, labelled ``hbm_label``) and 80% of it on top."""
    shapes = list(dict.fromkeys(r["shape"] for r in doc["rows"]))
    cols = min(2, len(shapes))
    nrows = -(-len(shapes) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(WIDTH_IN, 3.6 * nrows), squeeze=False, sharey=True)
    for ax, shape in zip(axes.flat, shapes, strict=False):
        rows = [r for r in doc["rows"] if r["shape"] == shape]
        names = list(dict.fromkeys(n for r in rows for n in r["contestants"]))
        for name in names:
            pts = [(r["tokens"], r["contestants"][name]["gbps"]) for r in rows
                   if "gbps" in r["contestants"].get(name, {})]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, label=LABELS.get(name, name),
                        color=color(OURS_COLORS.get(name, name)),
                        ls={"ours_graph": "--", "ours_wide": ":", "stream_graph": "-."}.get(name, "-"))
        # the ceiling in the legend, not written over the lines that reach it
        ax.axhline(hbm_bps / 1e9, color=color("ceiling"), lw=1, label=f"{hbm_label} {hbm_bps / 1e12:.2f} TB/s")
        ax.axhline(0.8 * hbm_bps / 1e9, color=color("ceiling"), lw=0.8, ls=":", label="80% of it")
        ax.set(xscale="log", xlabel="tokens", title=shape, ylim=(0, 1.12 * hbm_bps / 1e9))
        ax.set_xticks([r["tokens"] for r in rows], [str(r["tokens"]) for r in rows])
    return finish_grid(fig, axes, len(shapes), "GB/s of expert weights read")


# the three "ours" lines differ in colour as well as in dash style
OURS_COLORS = {"ours": "ours", "ours_graph": "ours_layer", "ours_wide": "ours_decode", "stream_graph": "ceiling"}


def target_checks(doc: dict, hbm_bps: float) -> list[dict]:
    """Chapter 3's targets at every recorded size, for ``ours`` as a user calls it: one dict per
    (target, shape, tokens) with ``value``, ``value_graph`` (CUDA-graph replay), ``value_min``
    (our fastest sample), ``bar`` and ``met`` (chapter 2's ``targets`` figure draws them). A target whose
    reference contestant was skipped at a size (out of memory) is not checked there."""
    def us(c, k, t="median_ms"):
        return c[k][t] * 1e3 if t in c.get(k, {}) else float("nan")

    out = []
    for r in doc["rows"]:
        c = r["contestants"]
        hf = [v for v in (us(c, "batched_mm"), us(c, "grouped_mm")) if v == v]  # skipped ones are nan
        best = min(hf) if hf else math.nan
        for target, bar, num in (("≥ 80% of HBM", 80, None), ("≥ 3× batched_mm", 3, us(c, "batched_mm")),
                                 ("never slower than transformers' best", 1, best)):
            if num is not None and num != num:
                continue  # the reference was not measured at this size (skipped): nothing to compare
            def val(k, t="median_ms", num=num, r=r, c=c):
                return (100 * r["expert_bytes"] / (us(c, k, t) / 1e6) / hbm_bps if num is None
                        else num / us(c, k, t))
            v = val("ours")
            out.append({"target": target, "shape": r["shape"], "tokens": r["tokens"], "bar": bar,
                        "value": v, "value_graph": val("ours_graph"), "value_min": val("ours", "min_ms"),
                        "met": v >= bar})
    return out


# The wide tiles of the recorded ``ours_wide`` contestant (results/h200/decode.json): four times
# the rows of gate/up and of down per program of the thin default at one token.
WIDE_BLOCK_I, WIDE_BLOCK_HO = 128, 128
