"""Figures: every PNG records its smallest text (dispatch_book.figures.textsize), which the page
check holds to 9 px as shown; the widget's slider labels are shown whole."""
import io

import matplotlib.pyplot as plt
import pytest

from dispatch_book.figures import textsize


def saved(fig, **kw) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **kw)
    plt.close(fig)
    return buf.getvalue()


def test_the_png_records_the_smallest_text_drawn():
    fig, ax = plt.subplots(figsize=(3, 2), dpi=100)
    ax.tick_params(labelsize=12)
    ax.set_title("title", fontsize=14)
    ax.annotate("note", (0.5, 0.5), fontsize=7)
    assert textsize.text_px(saved(fig, bbox_inches="tight")) == pytest.approx(7 * 100 / 72, abs=0.01)
    fig, ax = plt.subplots(dpi=100)
    ax.text(0.5, 0.5, "only this", fontsize=20)
    ax.text(0.5, 0.2, "   ", fontsize=3)  # blank: nothing drawn to read
    ax.axis("off")  # tick labels not drawn: not counted
    assert textsize.text_px(saved(fig, dpi=50)) == pytest.approx(20 * 50 / 72, abs=0.01)


def test_png_text_chunks_are_read_and_other_files_have_none():
    fig, _ = plt.subplots(figsize=(1, 1))
    chunks = textsize.png_text(saved(fig))
    assert textsize.TEXT_PX_KEY in chunks and "Matplotlib" in chunks["Software"]
    assert textsize.png_text(b"GIF89a...") == {} and textsize.text_px(b"") is None


def test_the_widget_shows_its_labels_whole():
    from dispatch_book.figures.routing import routing_widget

    sliders = routing_widget(seed=0).widget.children[:4]
    plt.close("all")
    assert [s.description for s in sliders] == ["num_experts", "top_k", "temperature", "tokens"]
    assert {s.style.description_width for s in sliders} == {"initial"}


def test_slot_labels_fit_their_slots_and_stay_9_pt():
    """Chapter 3's picture: with few slots each is named with its rows; with many, every few slots
    are named, the names never overlapping, all in 9 pt (>= 9 px in the column at the widest)."""
    import torch

    from dispatch_book.figures import SMALL_PT, decode

    fig = decode.tiling(torch.tensor([[0, 7], [1, 3], [2, 5], [3, 1]]), 8, 32, 16)
    assert [t.get_text().split("\n")[0] for t in fig.axes[1].texts] == ["e0", "e1", "e2", "e3", "e5", "e7"]
    assert all("\nrows [" in t.get_text() for t in fig.axes[1].texts)
    assert textsize.text_px(saved(fig, bbox_inches="tight")) == pytest.approx(SMALL_PT * 100 / 72, abs=0.01)
    fig = decode.tiling(torch.arange(64).reshape(8, 8), 64, 32, 16)
    labels = fig.axes[1].texts
    assert 1 < len(labels) < 64 and not any("rows" in t.get_text() for t in labels)
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in labels]
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False)), "labels overlap"
    plt.close(fig)
