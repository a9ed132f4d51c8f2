"""The book's own tooling, beside the library: benchmarks and their recorded results
(``dispatch_book.bench``; the recordings ship as ``dispatch_book.results``), the chapters' figures
(``dispatch_book.figures``) and the builder that executes the chapters and builds the HTML book
(``dispatch_book.build``, with ``execute``, ``headers`` and ``gpu_book``).

``dispatch`` (the library) never imports this package.
"""
