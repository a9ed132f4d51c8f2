"""A check over the built book: ``python -m dispatch_book.htmlcheck _build/html`` (run by ``make book``).

It reads every page's article (the theme's navigation and buttons are left out) and fails on:

* **code lines too wide for the column**: a line of a code cell's input, or of any other code block,
  longer than ``CODE_CHARS`` (88), and a line of a cell's text output longer than ``OUTPUT_CHARS``.
  Both limits are 88 because that is what the page shows without a scroll bar: at a 1280 px
  window sphinx-book-theme's article is 740 px wide and a cell's code block 672 px, 640 px inside its
  2×16 px padding; ``book/_static/dispatch.css`` sets code in 12 px monospace (7.22 px a character in
  Chromium), so 88 characters fit (the theme's 14 px fits only 75). An output is
  held to the same limit as code: its last columns are often the conclusion (a verdict, a unit).
* **figures drawn below 70% of their width**: an image in a cell's output whose CSS width (the
  ``width`` attribute, else the PNG's pixel width read from the file or the data URI) exceeds the
  676 px a cell's output area has at a 1280 px window by more than 1/0.7, i.e. is wider than
  ``COLUMN_PX / MIN_SCALE`` = 965 px; its labels and legend are then drawn at under 70% of the size
  they were made at.
* **words about how the book was made** (``WORDS``, case-insensitive, whole words), anywhere in the
  article: prose, code and outputs.
* **names the book must never mention** (``HIDDEN``): names of unpublished projects. They are kept as
  SHA-256 digests of the lower-cased word, so that the repository never spells them: every word of the
  article (a run of letters and digits) is hashed and looked up. A digest hides a name from a reader of
  the code, not from someone who guesses it; that is all it is for.

Then every page in headless Chromium (``dispatch_book.browsercheck``): a JavaScript error, a local
resource that is missing (404), a table wider than the column that nothing scrolls, figure text
under 9 px as shown. ``--browser auto`` (the default) runs these where Chromium is installed and
says so where it is not; ``required`` (CI) fails without it; ``off`` skips them.

``python -m dispatch_book.htmlcheck DIR`` prints each finding with its page and a per-page count,
and exits 1 if there is any (2 if the browser checks are required and cannot run).
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import pathlib
import re
import struct
import sys
from html.parser import HTMLParser

CODE_CHARS = 88
OUTPUT_CHARS = 88
COLUMN_PX = 676
MIN_SCALE = 0.7
WORDS = re.compile(r"shared/|\b(?:the issue|issues|tickets?|helpers?|the lead)\b", re.IGNORECASE)
# sha256(word.lower()) of each name the book must never mention (see the module's docstring).
HIDDEN = frozenset({
    "3e865a8f1fca8d39afb548a7b2ff97019d9f12a3af0a846d4ef83b584b59fd0d",
})
_WORD = re.compile(r"[^\W_]+")
_BLOCKS = {"div", "p", "pre", "li", "td", "th", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "br", "section", "dt", "dd"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@dataclasses.dataclass(frozen=True)
class Finding:
    page: str
    kind: str  # "code", "output", "figure", "words"; in the browser: "javascript", "missing", "table", "figure text"
    detail: str

    def __str__(self) -> str:
        return f"{self.page}: {self.kind}: {self.detail}"


class _Article(HTMLParser):
    """Collects, inside ``<article>``: code blocks (input/output/other), output images, and all text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, set[str]]] = []
        self.blocks: list[tuple[str, str]] = []
        self.images: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self._pre: list[str] | None = None
        self._pre_kind = ""

    def _inside(self, cls: str) -> bool:
        return any(cls in classes for _, classes in self.stack)

    def _in_article(self) -> bool:
        return any(tag == "article" for tag, _ in self.stack)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in _BLOCKS:
            self.text.append("\n")  # words in two blocks are two words
        if tag == "img":
            if self._in_article() and self._inside("cell_output"):
                self.images.append((a.get("src") or "", a.get("width")))
            return
        if tag in _VOID:
            return
        self.stack.append((tag, set((a.get("class") or "").split())))
        if tag == "pre" and self._in_article() and self._pre is None:
            self._pre = []
            self._pre_kind = ("input" if self._inside("cell_input") else
                              "output" if self._inside("cell_output") else "code")

    def handle_endtag(self, tag):
        if tag in _BLOCKS:
            self.text.append("\n")
        if tag in _VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break
        if tag == "pre" and self._pre is not None and not any(t == "pre" for t, _ in self.stack):
            self.blocks.append((self._pre_kind, "".join(self._pre)))
            self._pre = None

    def handle_data(self, data):
        if not self._in_article():
            return
        self.text.append(data)
        if self._pre is not None:
            self._pre.append(data)


def png_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a PNG from its header, or None if ``data`` is not a PNG."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def image_width(src: str, width_attr: str | None, page: pathlib.Path) -> int | None:
    """The CSS width an image asks for: its width attribute, else the PNG's pixel width."""
    if width_attr:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(px)?\s*", width_attr)
        if m:
            return round(float(m.group(1)))
        return None  # a percentage or another unit: sized by the page, not by its pixels
    if src.startswith("data:image/png;base64,"):
        head = base64.b64decode(src.split(",", 1)[1][:64] + "==", validate=False)
        size = png_size(head)
    else:
        path = (page.parent / src.split("#")[0].split("?")[0])
        if not path.is_file():
            return None
        with path.open("rb") as f:
            size = png_size(f.read(24))
    return size[0] if size else None


def _short(line: str, n: int = 60) -> str:
    line = line.strip()
    return line if len(line) <= n else line[: n - 1] + "…"


def check_page(path: pathlib.Path, name: str | None = None, code_chars: int = CODE_CHARS,
               output_chars: int = OUTPUT_CHARS, column_px: int = COLUMN_PX,
               min_scale: float = MIN_SCALE) -> list[Finding]:
    """Every finding on one built page (``name``: how the page is called in the findings)."""
    name = name or path.name
    parser = _Article()
    parser.feed(path.read_text(encoding="utf-8"))
    parser.close()
    found = []
    for kind, text in parser.blocks:
        limit = output_chars if kind == "output" else code_chars
        label = "output" if kind == "output" else "code"
        for line in text.expandtabs().splitlines():
            line = line.rstrip()
            if len(line) > limit:
                found.append(Finding(name, label, f"{kind} line of {len(line)} > {limit} characters: {_short(line)}"))
    for src, width_attr in parser.images:
        width = image_width(src, width_attr, path)
        if width is not None and width * min_scale > column_px:
            shown = "data URI" if src.startswith("data:") else src.rsplit("/", 1)[-1][:16]
            found.append(Finding(name, "figure", f"{shown}: {width} px wide, drawn at {column_px} px "
                                                 f"({100 * column_px / width:.0f}% < {100 * min_scale:.0f}%)"))
    text = re.sub(r"\s+", " ", "".join(parser.text))
    hits = [*WORDS.finditer(text), *hidden_words(text)]
    for m in sorted(hits, key=lambda m: m.start()):
        context = text[max(0, m.start() - 30): m.end() + 30]
        found.append(Finding(name, "words", f"{m.group(0)!r} in …{context.strip()}…"))
    return found


def hidden_words(text: str, hidden: frozenset[str] | None = None) -> list[re.Match]:
    """The words of ``text`` whose lower-cased SHA-256 digest is in ``hidden`` (default ``HIDDEN``)."""
    hidden = HIDDEN if hidden is None else hidden
    return [m for m in _WORD.finditer(text)
            if hashlib.sha256(m.group(0).lower().encode()).hexdigest() in hidden]


def pages(root: pathlib.Path) -> list[pathlib.Path]:
    """The book's HTML pages (the theme's static files and Sphinx's own index pages left out)."""
    skip = {"genindex.html", "search.html", "py-modindex.html"}
    return sorted(p for p in root.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(root).parts[:-1]) and p.name not in skip)


def check(root: pathlib.Path, browser: bool = False, **limits) -> list[Finding]:
    """The findings of every page; ``browser``: also those of the pages opened in Chromium."""
    root = pathlib.Path(root)
    if not (root / "index.html").is_file():
        raise SystemExit(f"{root}: no index.html: build the book first (make book)")
    found = []
    for p in pages(root):
        found += check_page(p, p.relative_to(root).as_posix(), **limits)
    if browser:
        from dispatch_book import browsercheck

        found += browsercheck.check(root, pages(root), Finding)
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.htmlcheck", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("html", nargs="?", default="_build/html", help="the built book (default _build/html)")
    ap.add_argument("--code-chars", type=int, default=CODE_CHARS)
    ap.add_argument("--output-chars", type=int, default=OUTPUT_CHARS)
    ap.add_argument("--column-px", type=int, default=COLUMN_PX)
    ap.add_argument("--browser", choices=["auto", "required", "off"], default="auto",
                    help="the checks in headless Chromium: where installed (auto), always (required), never (off)")
    args = ap.parse_args(argv)
    from dispatch_book.browsercheck import missing_browser

    missing = missing_browser() if args.browser != "off" else None
    if missing and args.browser == "required":
        print(f"htmlcheck: the browser checks cannot run: {missing}", file=sys.stderr)
        return 2
    if missing:
        print(f"htmlcheck: browser checks skipped (JavaScript errors, 404s, wide tables, figure text): {missing}")
    found = check(pathlib.Path(args.html), browser=args.browser != "off" and not missing,
                  code_chars=args.code_chars, output_chars=args.output_chars, column_px=args.column_px)
    for f in found:
        print(f)
    counts: dict[str, dict[str, int]] = {}
    for f in found:
        counts.setdefault(f.page, {}).setdefault(f.kind, 0)
        counts[f.page][f.kind] += 1
    for page, c in counts.items():
        print(f"{page}: " + ", ".join(f"{n} {k}" for k, n in sorted(c.items())))
    print(f"htmlcheck: {len(found)} finding(s) in {len(counts)} page(s)" if found else "htmlcheck: every page passes")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
