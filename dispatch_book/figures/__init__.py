"""The book's figures: one module per chapter (``routing``, ``triton``, ``sorting``, ``gemm``,
``decode``, ``parallel``, ``balance``, ``engine``, ``serving``, ``speculative``), sharing the few
conventions below. Every PNG drawn once this package is imported records the size of its smallest
text (``textsize``), which the page check holds to 9 px as the book shows it."""
from __future__ import annotations

from dispatch_book.figures import textsize

textsize.record()

# The widest figure: 9.4 in at the inline backend's 100 dpi, about 950 px with its tight bounding box,
# which the book shows in a cell's output area (676 px at a 1280 px window) at 71%. Its smallest
# text, SMALL_PT = 10 pt (13.9 px drawn), then shows at 9.9 px: at least textsize.MIN_TEXT_PX (9),
# which the page check holds. (9 pt would show at 8.9-9.1 px: too close.)
WIDTH_IN = 9.4
SMALL_PT = 10


def fits(text: str, width_in: float, fontsize: float = SMALL_PT) -> bool:
    """Whether ``text`` (one line) set in ``fontsize`` points in the default font is at most ``width_in`` wide."""
    from matplotlib.textpath import TextPath

    return TextPath((0, 0), text, size=fontsize).get_extents().width / 72 <= width_in


def plain_log(ax, xs=None) -> None:
    """Log axes labelled in plain numbers: x ticks at ``xs`` (the measured points) when given; y major
    ticks at 1, 1.5, 2, 3, 5, 7 × 10^k, no minor labels (log axes' 6×10¹-style labels crowd and overlap)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if xs is not None:
        xs = sorted(set(xs))
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


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
    fig.legend(handles, labels, fontsize=SMALL_PT, loc="lower center", ncol=3, frameon=False)
    legend_in = 0.12 + 0.24 * -(-len(labels) // 3)  # inches under the panels: a row of SMALL_PT text each
    fig.tight_layout(rect=(0, legend_in / fig.get_size_inches()[1], 1, 1))
    return fig
