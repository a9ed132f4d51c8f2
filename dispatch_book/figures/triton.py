"""Chapter 0.5's figure: how a 2-D grid of Triton programs tiles a matrix product C = A · B."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from dispatch_book.figures import SMALL_PT

TILE, READ, EDGE = "#d62728", "#fdd0a2", "#d9d9d9"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _matrix(ax, rows: int, cols: int, name: str):
    ax.add_patch(Rectangle((0, 0), cols, rows, fill=False, lw=1.2))
    ax.set_xlim(-0.5, cols + 0.5)
    ax.set_ylim(rows + 0.5, -0.5)  # row 0 at the top, as a matrix is written
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(f"{name}  [{rows} × {cols}]", fontsize=10)


def program_grid(M: int, N: int, K: int, block_m: int, block_n: int, block_k: int, *, pid=(1, 1)):
    """A, B and C of C = A · B drawn to scale. C is cut into cdiv(M, block_m) × cdiv(N, block_n)
    tiles, one per program, each labelled with its (pid_m, pid_n); program ``pid`` is filled, and
    the block rows of A and block columns of B it reads (in block_k steps along K) are shaded.
    Grey: the part of an edge tile past M or N, which the program computes masked.
    Returns the figure."""
    if min(M, N, K, block_m, block_n, block_k) < 1:
        raise ValueError(f"sizes and blocks must be >= 1, got M={M} N={N} K={K} blocks "
                         f"{block_m}×{block_n}×{block_k}")
    gm, gn = _cdiv(M, block_m), _cdiv(N, block_n)
    pm, pn = pid
    if not (0 <= pm < gm and 0 <= pn < gn):
        raise ValueError(f"pid {pid} is outside the grid of {gm} × {gn} programs")
    fig, (a_ax, b_ax, c_ax) = plt.subplots(1, 3, figsize=(9.4, 3.6),
                                           gridspec_kw={"width_ratios": [K, N, N]}, constrained_layout=True)
    _matrix(a_ax, M, K, "A")
    _matrix(b_ax, K, N, "B")
    _matrix(c_ax, M, N, "C")
    r0, r1 = pm * block_m, min((pm + 1) * block_m, M)
    c0, c1 = pn * block_n, min((pn + 1) * block_n, N)
    a_ax.add_patch(Rectangle((0, r0), K, r1 - r0, color=READ, zorder=0))
    b_ax.add_patch(Rectangle((c0, 0), c1 - c0, K, color=READ, zorder=0))
    for k in range(block_k, K, block_k):  # the steps of the K loop
        a_ax.plot([k, k], [r0, r1], color="black", lw=0.6, ls=":")
        b_ax.plot([c0, c1], [k, k], color="black", lw=0.6, ls=":")
    for i in range(gm):
        for j in range(gn):
            y, x = i * block_m, j * block_n
            h, w = min(block_m, M - y), min(block_n, N - x)
            mine = (i, j) == (pm, pn)
            c_ax.add_patch(Rectangle((x, y), w, h, fill=mine, color=TILE if mine else "black",
                                     lw=0.8, alpha=0.85 if mine else 1.0))
            if block_m * (i + 1) > M or block_n * (j + 1) > N:  # the masked overhang of an edge tile
                c_ax.add_patch(Rectangle((x, y), block_n, block_m, facecolor=EDGE, edgecolor="white",
                                         hatch="//", zorder=0, lw=0))
                c_ax.add_patch(Rectangle((x, y), w, h, facecolor="white", zorder=0.1, lw=0))
            c_ax.text(x + w / 2, y + h / 2, f"({i},{j})", ha="center",
                      va="center", fontsize=SMALL_PT, color="white" if mine else "black")
    c_ax.set_xlim(-0.5, gn * block_n + 0.5)
    c_ax.set_ylim(gm * block_m + 0.5, -0.5)
    fig.suptitle(f"grid ({gm}, {gn}): program ({pm},{pn}) computes its {block_m} × {block_n} tile of C "
                 f"from {block_m} rows of A and {block_n} columns of B, {block_k} at a time", fontsize=SMALL_PT)
    return fig
