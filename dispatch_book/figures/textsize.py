"""How small a figure's text is, recorded in the figure's PNG so the page check can see it.

A PNG in a page is an image: the browser scales it to the column, and the text drawn in it shrinks
with it. ``record()`` (called when ``dispatch_book`` or ``dispatch_book.figures`` is imported with
matplotlib loaded) makes every PNG that matplotlib's Agg canvas writes — the inline backend's
figures in the chapters included — carry one more text chunk, ``TEXT_PX_KEY``: the height in the
image's pixels of the smallest text drawn (a font size in points × dpi / 72, over the texts that
were actually drawn: labels, ticks, legends, annotations). ``dispatch_book.htmlcheck`` multiplies
it by the scale the page shows the image at and fails under ``MIN_TEXT_PX``.

The figures here keep to it with ``figures.WIDTH_IN`` (9.4 in) and ``figures.SMALL_PT`` (10 pt).
"""
from __future__ import annotations

import contextlib
import functools
import struct
import zlib

TEXT_PX_KEY = "dispatch text px"
MIN_TEXT_PX = 9.0


def record() -> None:
    """Make the Agg canvas write ``TEXT_PX_KEY`` into every PNG (once per process)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if getattr(FigureCanvasAgg.print_png, "records_text_px", False):
        return
    print_png = FigureCanvasAgg.print_png

    @functools.wraps(print_png)  # its signature and module: matplotlib passes it only what print_png takes
    def print_png_recording(self, filename_or_obj, *args, metadata=None, **kwargs):
        sizes: list[float] = []
        with _drawn_text_sizes(sizes):
            FigureCanvasAgg.draw(self)  # as the PNG will draw it (dpi and bounding box already set)
        metadata = {**(metadata or {}), TEXT_PX_KEY: f"{min(sizes):.2f}" if sizes else "none"}
        return print_png(self, filename_or_obj, *args, metadata=metadata, **kwargs)

    print_png_recording.records_text_px = True
    FigureCanvasAgg.print_png = print_png_recording


@contextlib.contextmanager
def _drawn_text_sizes(sizes: list[float]):
    """While active, every non-empty Text that draws appends its height in pixels to ``sizes``."""
    from matplotlib.text import Text

    draw = Text.draw

    def draw_recording(self, renderer):
        if renderer is not None and self.get_visible() and self.get_text().strip():
            sizes.append(renderer.points_to_pixels(self.get_fontsize()))
        return draw(self, renderer)

    Text.draw = draw_recording
    try:
        yield
    finally:
        Text.draw = draw


def png_text(data: bytes) -> dict[str, str]:
    """The text chunks (tEXt, zTXt, iTXt) of a PNG's bytes: {keyword: text}; {} if not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return {}
    out, i = {}, 8
    while i + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[i:i + 8])
        body = data[i + 8:i + 8 + n]
        i += 12 + n
        if kind == b"IEND":
            break
        if kind not in (b"tEXt", b"zTXt", b"iTXt") or b"\0" not in body:
            continue
        key, rest = body.split(b"\0", 1)
        if kind == b"tEXt":
            text = rest.decode("latin-1")
        elif kind == b"zTXt":
            text = zlib.decompress(rest[1:]).decode("latin-1")
        else:  # iTXt: compressed flag, method, language tag \0, translated keyword \0, text
            flag, rest = rest[0], rest[2:]
            text = rest.split(b"\0", 2)[2]
            text = (zlib.decompress(text) if flag else text).decode("utf-8")
        out[key.decode("latin-1")] = text
    return out


def text_px(data: bytes) -> float | None:
    """The smallest text height a PNG recorded (image pixels), or None if it recorded none."""
    value = png_text(data).get(TEXT_PX_KEY)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
