"""Chapter 6's figure: decode tokens/s of every contestant against the batch, under the roofline.

The drawing function returns the figure; the notebook cell calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

# a colour per line (the end-to-end race has eleven contestants, matplotlib's cycle ten)
LINE_COLORS = (*plt.cm.tab10.colors, "navy", "darkgoldenrod")


def decode_throughput(doc: dict, title: str):
    """Decode tokens/s against the batch (log-log) for each contestant of an ``e2e`` recording, in
    the file's order: ours and its variants (``ours*``) solid with dots, transformers' ways dotted
    with squares; the dashed line is ours' bandwidth roofline (``roofline_tok_s``, bf16 weights)."""
    rows = [r for r in doc["rows"] if "decode_tok_s" in r]
    if not rows:
        raise ValueError("decode_throughput() needs rows with 'decode_tok_s' (an e2e recording)")
    names = list(dict.fromkeys(r["contestant"] for r in rows))
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for i, name in enumerate(names):
        pts = sorted((r["batch"], r["decode_tok_s"]) for r in rows if r["contestant"] == name)
        ours = name.startswith("ours")
        ax.plot(*zip(*pts, strict=True), color=LINE_COLORS[i % len(LINE_COLORS)], label=name,
                marker="o" if ours else "s", ls="-" if ours else ":", lw=2.5 if name == "ours" else 1.2)
    roof = sorted({(r["batch"], r["roofline_tok_s"]) for r in rows if r["contestant"] == "ours"})
    if roof:
        ax.plot(*zip(*roof, strict=True), "k--", label="bandwidth roofline (bf16)")
    batches = sorted({r["batch"] for r in rows})
    ax.set(xscale="log", yscale="log", xlabel="batch (rows decoding together)", ylabel="decode tokens/s",
           title=title)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    return fig
