"""The page checks in headless Chromium (dispatch_book.browsercheck), on small hand-made pages:
one page per failure it must catch, each beside a page that differs only by the fix."""
import io
import os

import matplotlib.pyplot as plt
import pytest

from dispatch_book import browsercheck, htmlcheck
from dispatch_book.figures import textsize  # noqa: F401  (PNGs record their text size from here on)

MISSING = browsercheck.missing_browser()
if MISSING and os.environ.get("DISPATCH_REQUIRE_BROWSER"):  # CI: the checks must run
    raise RuntimeError(f"the browser checks cannot run: {MISSING}")
pytestmark = pytest.mark.skipif(MISSING is not None, reason=f"browser checks: {MISSING}")

COLUMN = 600  # the hand-made pages' article width, px


def figure_png(width_in: float, fontsize: float) -> bytes:
    """A figure ``width_in`` inches wide at 100 dpi whose smallest text is ``fontsize`` pt."""
    fig, ax = plt.subplots(figsize=(width_in, 2), dpi=100)
    ax.plot([0, 1], [0, 1])
    ax.tick_params(labelsize=max(fontsize, 12))
    ax.set_title("a title", fontsize=max(fontsize, 12))
    ax.text(0.1, 0.5, "the smallest text", fontsize=fontsize)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def html(body: str, head: str = "") -> str:
    """A page whose article is COLUMN px wide; images at most that wide (as book/_static/dispatch.css has it)."""
    return (f'<html><head><title>t</title><link rel="icon" href="data:,">{head}'
            "<style>img { max-width: 100%; } td { white-space: nowrap; }</style></head><body>"
            f'<article style="width:{COLUMN}px;padding:0;margin:0">{body}</article></body></html>')


def table(columns: int) -> str:
    row = "".join(f"<td>a rather long cell {i}</td>" for i in range(columns))
    return f"<table><tr>{row}</tr><tr>{row}</tr></table>"


PAGES = {
    "clean.html": html("<p>fine</p><script>const A = 1;</script><script>const B = 2;</script>"),
    "js_twice.html": html("<script>const A = 1;</script><script>const A = 1;</script>"),
    "js_throws.html": html("<script>window.addEventListener('load', function () { null.x; });</script>"),
    "js_rejects.html": html("<script>Promise.reject(new Error('no widget state'));</script>"),
    "missing.html": html('<img src="nowhere.png"><script src="gone.js"></script>',
                         head='<link rel="stylesheet" href="lost.css">'),
    "present.html": html('<img src="small.png"><script src="here.js"></script>',
                         head='<link rel="stylesheet" href="here.css">'),
    "late_font.html": html("<script>setTimeout(function () { var p = document.createElement('p'); "
                           "p.className = 'f'; p.textContent = 'x'; document.body.appendChild(p); }, 200);</script>",
                           head="<style>@font-face{font-family:Late;src:url(fonts/late.woff2)}"
                                ".f{font-family:Late}</style>"),  # a font asked for after the load event
    "other_host.html": html('<img src="http://example.invalid/badge.svg">'),
    "wide_table.html": html(table(11)),
    "wide_table_scrolls.html": html(f'<div style="overflow-x:auto">{table(11)}</div>'),
    "narrow_table.html": html(table(2)),
    "small_text.html": html('<div class="cell_output"><img src="wide_small.png"></div>'),
    "readable_text.html": html('<div class="cell_output"><img src="narrow_big.png"></div>'),
    "small_text_drawn_small.html": html('<div class="cell_output"><img src="narrow_big.png" width="120"></div>'),
}


@pytest.fixture(scope="module")
def findings(tmp_path_factory):
    """{page: [(kind, detail)]} for every page of PAGES, checked in one browser."""
    root = tmp_path_factory.mktemp("site")
    for name, text in PAGES.items():
        (root / name).write_text(text)
    (root / "small.png").write_bytes(figure_png(2, 12))
    (root / "here.js").write_text("window.here = 1;")
    (root / "here.css").write_text("p { color: black; }")
    (root / "wide_small.png").write_bytes(figure_png(9.4, 6))   # 940 px shown at 600: 8.3 px · 0.64 = 5.3 px
    (root / "narrow_big.png").write_bytes(figure_png(5, 10))    # 500 px shown at 500: 13.9 px
    found = {name: [] for name in PAGES}
    for f in browsercheck.check(root, [root / name for name in PAGES], htmlcheck.Finding):
        found[f.page].append((f.kind, f.detail))
    return found


def kinds(findings, page):
    return sorted(kind for kind, _ in findings[page])


def test_a_clean_page_passes(findings):
    for page in ("clean.html", "present.html", "narrow_table.html", "readable_text.html", "other_host.html",
                 "wide_table_scrolls.html"):
        assert findings[page] == [], page


def test_javascript_errors_fail(findings):
    (twice,) = findings["js_twice.html"]
    assert twice[0] == "javascript" and "SyntaxError" in twice[1] and "'A' has already been declared" in twice[1]
    assert kinds(findings, "js_throws.html") == ["javascript"]
    assert kinds(findings, "js_rejects.html") == ["javascript"]
    assert "no widget state" in findings["js_rejects.html"][0][1]


def test_missing_local_files_fail_also_when_a_script_asks_late(findings):
    assert sorted(d for _, d in findings["missing.html"]) == ["404 gone.js", "404 lost.css", "404 nowhere.png"]
    assert findings["late_font.html"] == [("missing", "404 fonts/late.woff2")]


def test_a_wide_table_fails_unless_something_scrolls_it(findings):
    ((kind, detail),) = findings["wide_table.html"]
    assert kind == "table" and "11 columns" in detail and f"in a {COLUMN} px column" in detail


def test_figure_text_under_9_px_as_shown_fails(findings):
    ((kind, detail),) = findings["small_text.html"]
    assert kind == "figure text" and "< 9 px" in detail
    shown = float(detail.split("smallest text ")[1].split(" px")[0])
    assert shown == pytest.approx(6 * 100 / 72 * COLUMN / 940, abs=0.15)
    # the same PNG that passes at its own size fails when the page draws it at 120 px
    assert kinds(findings, "small_text_drawn_small.html") == ["figure text"]

