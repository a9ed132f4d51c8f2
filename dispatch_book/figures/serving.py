"""Chapter 8's figures: slot occupancy, the block pool, tokens per step, the MoE twist, latency vs load.

Computations (``occupancy``, ``experts_read``) are separate from the drawing, and tested on their
own; each drawing function returns the figure (the notebook cell calls ``plt.show()``).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap

from dispatch_book.figures import SMALL_PT, color, plain_log


def occupancy(out_lens: list[int], slots: int, mode: str) -> np.ndarray:
    """Which request holds each of ``slots`` batch slots at each decode step: [slots, steps], -1 idle.
    Every request is waiting at step 0 and needs ``out_lens[i]`` steps in a slot. ``"static"``: groups
    of ``slots`` requests in order, a group runs until its longest is done; ``"continuous"``: a slot
    that frees is refilled by the next waiting request at the next step."""
    if mode not in ("static", "continuous"):
        raise ValueError(f"mode must be 'static' or 'continuous', got {mode!r}")
    if slots < 1 or any(n < 1 for n in out_lens):
        raise ValueError("need at least one slot and requests of at least one step")
    cols: list[list[int]] = []
    if mode == "static":
        for g in range(0, len(out_lens), slots):
            group = list(range(g, min(g + slots, len(out_lens))))
            for t in range(max(out_lens[i] for i in group)):
                cols.append([(group[s] if s < len(group) and t < out_lens[group[s]] else -1) for s in range(slots)])
    else:
        held, left, nxt = [-1] * slots, [0] * slots, 0
        while nxt < len(out_lens) or any(h >= 0 for h in held):
            for s in range(slots):
                if held[s] < 0 and nxt < len(out_lens):
                    held[s], left[s], nxt = nxt, out_lens[nxt], nxt + 1
            cols.append(list(held))
            for s in range(slots):
                if held[s] >= 0:
                    left[s] -= 1
                    if left[s] == 0:
                        held[s] = -1
    return np.array(cols, dtype=np.int64).T


def plot_occupancy(out_lens: list[int], slots: int):
    """Static batching above, continuous batching below: a colour per request, white idle slots."""
    grids = {m: occupancy(out_lens, slots, m) for m in ("static", "continuous")}
    steps = max(g.shape[1] for g in grids.values())
    cmap = ListedColormap(plt.cm.tab20(np.linspace(0, 1, 20)))
    fig, axes = plt.subplots(2, 1, figsize=(8, 4.2), sharex=True)
    for ax, (mode, g) in zip(axes, grids.items(), strict=True):
        shown = np.ma.masked_less(np.pad(g, ((0, 0), (0, steps - g.shape[1])), constant_values=-1), 0) % 20
        ax.imshow(shown, aspect="auto", cmap=cmap, interpolation="nearest", vmin=0, vmax=19)
        busy = (g >= 0).mean()
        ax.set(ylabel="slot", title=f"{mode}: {g.shape[1]} steps, slots busy {busy:.0%} of the time")
        ax.set_yticks(range(slots))
    axes[-1].set_xlabel("decode step")
    fig.tight_layout()
    return fig


def plot_pool(num_blocks: int, tables: dict[str, list[int]]):
    """The pool as a row of blocks, coloured by the sequence holding each (hatched: held by several),
    with each sequence's block table written beside the figure's legend."""
    holders: dict[int, list[str]] = {}
    for name, blocks in tables.items():
        for b in blocks:
            holders.setdefault(b, []).append(name)
    fig, ax = plt.subplots(figsize=(8, 1.6))
    palette = plt.cm.tab10.colors
    names = list(tables)
    for b in range(num_blocks):
        who = holders.get(b, [])
        face = "white" if not who else palette[names.index(who[0]) % 10]
        ax.add_patch(plt.Rectangle((b, 0), 0.92, 1, facecolor=face, edgecolor="black",
                                   hatch="//" if len(who) > 1 else None))
        ax.text(b + 0.46, -0.35, str(b), ha="center", va="center", fontsize=8)
    for i, name in enumerate(names):
        ax.plot([], [], "s", color=palette[i % 10], label=f"{name}: table {tables[name]}")
    ax.set(xlim=(-0.2, num_blocks + 0.2), ylim=(-0.7, 1.2))
    ax.axis("off")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def plot_step_tokens(runs: dict[str, list[int]], budget: int | None = None):
    """Tokens per step of each run (e.g. with and without chunked prefill), one panel each."""
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.6 + 1.4 * len(runs)), sharex=True, squeeze=False)
    for ax, (name, tokens) in zip(axes[:, 0], runs.items(), strict=True):
        ax.bar(range(len(tokens)), tokens, color=color(name), width=0.85)
        if budget:
            ax.axhline(budget, color="black", ls="--", lw=1, label=f"budget {budget}")
            ax.legend(fontsize=8, loc="upper right")
        ax.set(ylabel="tokens", title=name)
    axes[-1, 0].set_xlabel("step")
    fig.tight_layout()
    return fig


def experts_read(tokens: list[int], *, E: int, K: int, H: int, I: int, layers: int, crossover: int,  # noqa: E741
                 itemsize: int = 2) -> list[dict]:
    """Per step of ``tokens`` tokens: the experts path the MoE layer takes (``"decode"`` at most
    ``crossover`` tokens, else ``"grouped"``), the experts it reads per layer under uniform routing,
    E·(1 − (1 − K/E)^T), and the expert bytes read per step and per token (gate, up, down: 3·H·I each)."""
    out = []
    for T in tokens:
        used = E * (1 - (1 - K / E) ** T)
        step = layers * used * 3 * H * I * itemsize
        out.append({"tokens": T, "path": "decode" if T <= crossover else "grouped", "experts_per_layer": used,
                    "bytes": step, "bytes_per_token": step / T})
    return out


def plot_moe_twist(rows: list[dict], title: str):
    """Expert bytes read per token against the step's token count (log-log), by path."""
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for path, mark in (("decode", "o"), ("grouped", "s")):
        pts = [(r["tokens"], r["bytes_per_token"] / 2**20) for r in rows if r["path"] == path]
        if pts:
            ax.plot(*zip(*sorted(pts), strict=True), mark, ls="-", label=f"{path} path")
    ax.set(xscale="log", yscale="log", xlabel="tokens in the step", ylabel="expert MiB read per token", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def latency_vs_load(rows: list[dict], title: str):
    """TTFT and TPOT (p50 solid, p99 dashed) against the arrival rate, one line per contestant
    (``online`` rows with measurements)."""
    rows = [r for r in rows if r.get("part") == "online" and isinstance(r.get("ttft_ms"), dict)]
    if not rows:
        raise ValueError("latency_vs_load() needs online rows with ttft_ms / tpot_ms (a serve recording)")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, label in ((axes[0], "ttft_ms", "time to first token (ms)"),
                           (axes[1], "tpot_ms", "time per output token (ms)")):
        for name in dict.fromkeys(r["contestant"] for r in rows):
            mine = sorted((r for r in rows if r["contestant"] == name), key=lambda r: r["rate"])
            for pct, ls in (("p50", "-"), ("p99", "--")):
                pts = [(r["rate"], r[key][pct]) for r in mine if r[key].get(pct) is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), ls=ls, marker="o", color=color(name), label=f"{name} {pct}")
        ax.set(xscale="log", yscale="log", xlabel="arrival rate (requests/s)", ylabel=label)
        plain_log(ax, [r["rate"] for r in rows])
    axes[0].legend(fontsize=SMALL_PT)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
