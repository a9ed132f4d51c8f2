"""The book's own tooling, beside the library: benchmarks and their recorded results
(``dispatch_book.bench``; the recordings ship as ``dispatch_book.results``), the chapters' figures
(``dispatch_book.figures``) and the builder that executes the chapters and builds the HTML book
(``dispatch_book.build``, with ``execute``, ``headers`` and ``gpu_book``).

``dispatch`` (the library) never imports this package.
"""
import sys as _sys

if "matplotlib" in _sys.modules:  # a chapter drawing figures: each PNG records its smallest text
    from dispatch_book.figures import textsize as _textsize

    _textsize.record()
