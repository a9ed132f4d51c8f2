"""The recorded GPU measurements the chapters plot, shipped as the package data ``dispatch_book.results``
(``results/<gpu-slug>/<name>.json``; see ``dispatch_book.bench.results``)."""
