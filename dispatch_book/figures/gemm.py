"""Chapter 2's figures: how the grouped GEMM tiles sorted rows, and the TFLOP/s it reaches."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dispatch_book.figures import SMALL_PT, WIDTH_IN, color, finish_grid, fits

LABELS = {"ours_grouped": "ours (grouped GEMM)", "ours_decode": "ours (decode kernels)",
          "ours_layer": "ours, whole layer (router+sort)", "hf_eager": "transformers eager",
          "hf_grouped_mm": "transformers grouped_mm", "hf_batched_mm": "transformers batched_mm"}
# the three "ours" lines differ in colour as well as in dash style
STYLE = {"ours_grouped": ("ours", "-"), "ours_decode": ("ours_decode", ":"), "ours_layer": ("ours_layer", "--"),
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
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(WIDTH_IN, 4.2), gridspec_kw={"width_ratios": [1.4, 1.2]})
    for s in range(used * bm):
        e = be[s // bm]
        pad = rows[s] >= N
        a0.add_patch(Rectangle((0, P - 1 - s), 1, 1, fc="white" if pad else cmap(e % 20), lw=0,
                               hatch="///" if pad else None))
    for b in range(used):
        a0.axhline(P - b * bm, color="k", lw=1)
        ns = [n for n in rows[b * bm:(b + 1) * bm] if n < N]
        shown = ", ".join(map(str, ns[:5])) + (", ..." if len(ns) > 5 else "")
        a0.text(1.05, P - b * bm - bm / 2, f"block {b}: e{be[b]}, rows n = {shown}", va="center", fontsize=SMALL_PT)
    a0.set(xlim=(0, 3.2), ylim=(P - used * bm, P), xticks=[], yticks=[],
           title=f"sorted slots (block_m={bm}), padding hatched")
    named = fits(f"({used - 1},{n_tiles - 1})", 0.8 * WIDTH_IN * 1.2 / 2.6 / n_tiles)  # a program's (b, j) in its cell
    for b in range(used):
        for j in range(n_tiles):
            a1.add_patch(Rectangle((j, used - 1 - b), 0.94, 0.94, fc=cmap(be[b] % 20), alpha=0.85))
            if named:
                a1.text(j + 0.47, used - 0.53 - b, f"({b},{j})", ha="center", va="center", fontsize=SMALL_PT)
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
    cols = min(2, len(shapes))
    rows_n = -(-len(shapes) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(WIDTH_IN, 3.6 * rows_n), squeeze=False, sharey=True)
    for ax, shape in zip(axes.flat, shapes, strict=False):
        rs = [r for r in rows if r["shape"] == shape and r.get("tflops")]  # a plain read does no FLOPs
        names = contestants or list(dict.fromkeys(r["contestant"] for r in rs))
        for name in names:
            pts = sorted((r["tokens"], r["tflops"]) for r in rs if r["contestant"] == name)
            if pts:
                base, ls = STYLE.get(name, (name, "-"))
                ax.plot(*zip(*pts, strict=True), marker="o", ms=3, ls=ls, color=color(base),
                        label=LABELS.get(name, name))
        ax.axhline(peak_flops / 1e12, color=color("ceiling"), lw=1)
        ax.text(1, peak_flops / 1e12 * 1.1, f"{peak_label} ({peak_flops / 1e12:.0f} TFLOP/s)", fontsize=SMALL_PT)
        ax.set(xscale="log", yscale="log", title=shape, xlabel="tokens")
        ax.grid(alpha=0.3, which="both")
    return finish_grid(fig, axes, len(shapes), "TFLOP/s (expert GEMMs)")


# The chapter's arc, step by step, and the recorded contestant that stands for each step.
ARC = (("1 loop over experts", "hf_eager"), ("2 padded bmm", "hf_batched_mm"),
       ("3 grouped GEMM (unfused)", "hf_grouped_mm"), ("4+5 fused SwiGLU, combine", "ours_grouped"))


def arc_steps(series: dict[str, dict[str, float]], *, title: str):
    """Grouped bars, one group per step of the chapter: ``series`` maps a label (a token count, a
    device) to {step label: milliseconds}; NaN or a missing step is written "not recorded"."""
    steps = list(dict.fromkeys(k for times in series.values() for k in times))
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
    fig, ax = plt.subplots(figsize=(9, 0.5 + 0.45 * len(steps) * len(series)))
    h = 0.8 / len(series)
    vals = [v for times in series.values() for v in times.values() if v == v]
    for j, (label, times) in enumerate(series.items()):
        ys = [i + (j - (len(series) - 1) / 2) * h for i in range(len(steps))]
        ms = [times.get(k, float("nan")) for k in steps]
        ax.barh(ys, [m if m == m else 0 for m in ms], height=h, color=palette[j % 4], label=label)
        for y, m in zip(ys, ms, strict=True):
            ax.text(m if m == m else min(vals), y, f" {m:.3g} ms" if m == m else " not recorded",
                    va="center", fontsize=SMALL_PT)
    ax.set_yticks(range(len(steps)), steps)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="ms per call (lower is better)", title=title)
    ax.set_xlim(min(vals) / 2, max(vals) * 6)
    ax.legend(fontsize=SMALL_PT, loc="lower right")
    fig.tight_layout()
    return fig


def targets(checks: list[dict]):
    """One dot per (target, size): the measured value over the target's bar (≥ 1 = met), coloured
    by shape, filled where met."""
    names = list(dict.fromkeys(c["target"] for c in checks))
    shapes = list(dict.fromkeys(c["shape"] for c in checks))
    palette = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e"]
    fig, ax = plt.subplots(figsize=(WIDTH_IN, 0.7 * len(names) + 1.6))
    for j, shape in enumerate(shapes):
        for met in (True, False):
            sel = [c for c in checks if c["shape"] == shape and c["met"] == met]
            ys = [names.index(c["target"]) + 0.12 * (j - len(shapes) / 2) for c in sel]
            ax.scatter([c["value"] / c["bar"] for c in sel], ys, s=28, color=palette[j % 5],
                       facecolors=palette[j % 5] if met else "none",
                       label=shape if met or not any(c["shape"] == shape and c["met"] for c in checks) else None)
    ax.axvline(1, color=color("ceiling"), lw=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xscale="log", xlabel="measured / target (right of the line: met; hollow: missed)")
    ax.legend(fontsize=SMALL_PT, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    return fig


def sweep(doc: dict, shape: str, tokens: int):
    """Bars: TFLOP/s of each pinned tile config (BLOCK_M, N, K, warps, stages), up and down kernels."""
    rs = [r for r in doc["rows"] if r["shape"] == shape and r["tokens"] == tokens and "tflops" in r
          and r["kernel"] in ("up", "down")]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6), sharey=True)
    for ax, kind in zip(axes, ("up", "down"), strict=True):
        sel = [r for r in rs if r["kernel"] == kind]
        ax.barh(range(len(sel)), [r["tflops"] for r in sel], color=color("ours"))
        ax.set_yticks(range(len(sel)), ["×".join(map(str, r["config"])) for r in sel], fontsize=SMALL_PT)
        ax.set(title=f"{kind} kernel, {shape}, T={tokens}", xlabel="TFLOP/s")
    axes[0].set_ylabel("BLOCK_M×N×K×warps×stages")
    fig.tight_layout()
    return fig


def target_checks(rows: list[dict], ours_row, peak_flops: float, hbm_bps: float) -> list[dict]:
    """The chapter's four targets at every size they apply to, from a recorded run, against the
    given ceilings: one dict per (target, shape, tokens) with ``value`` (at the median time),
    ``value_min`` (at our fastest sample), ``bar`` and ``met``. ``ours_row(shape, T)`` picks the
    row of the path ``moe()`` takes at that size."""
    def ms(shape, T, name):
        r = [x for x in rows if x["shape"] == shape and x["tokens"] == T and x["contestant"] == name
             and "median_ms" in x]
        return r[0]["median_ms"] if r else float("nan")

    hf = ("hf_eager", "hf_grouped_mm", "hf_batched_mm")
    out = []

    def add(target, shape, T, o, bar, value_of):
        v, v_min = value_of(o["median_ms"]), value_of(o["min_ms"])
        out.append({"target": target, "shape": shape, "tokens": T, "ours": o["contestant"], "bar": bar,
                    "value": v, "value_min": v_min, "met": v >= bar})

    for shape in dict.fromkeys(r["shape"] for r in rows):
        for T in sorted({r["tokens"] for r in rows if r["shape"] == shape}):
            o = ours_row(shape, T)
            if shape == "olmoe-1b-7b" and T >= 4096:
                add("≥ 1.2× grouped_mm (OLMoE, T ≥ 4096)", shape, T, o, 1.2,
                    lambda t, s=shape, T=T: ms(s, T, "hf_grouped_mm") / t)
                add("≥ 50% of bf16 peak (OLMoE, T ≥ 4096)", shape, T, o, 50,
                    lambda t, o=o: 100 * o["flops"] / (t / 1e3) / peak_flops)
            if T <= 64:
                add("≥ 80% of HBM on expert bytes (T ≤ 64)", shape, T, o, 80,
                    lambda t, o=o: 100 * o["expert_bytes"] / (t / 1e3) / hbm_bps)
                add("≥ 3× batched_mm (T ≤ 64)", shape, T, o, 3,
                    lambda t, s=shape, T=T: ms(s, T, "hf_batched_mm") / t)
            add("never slower than transformers' best", shape, T, o, 1,
                lambda t, s=shape, T=T: min(ms(s, T, n) for n in hf) / t)
    return out


def target_summary(checks: list[dict]) -> list[dict]:
    """Per target: met at how many sizes, and the missed sizes (shape T, and whether our fastest
    sample clears the bar: jitter rather than a structural miss)."""
    out = []
    for name in dict.fromkeys(c["target"] for c in checks):
        sel = [c for c in checks if c["target"] == name]
        missed = [f"{c['shape']} T={c['tokens']}{' (min clears)' if c['value_min'] >= c['bar'] else ''}"
                  for c in sel if not c["met"]]
        out.append({"target": name, "met": f"{sum(c['met'] for c in sel)} of {len(sel)}",
                    "missed at": ", ".join(missed) or "–"})
    return out
