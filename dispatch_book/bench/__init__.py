"""Benchmarks: one harness, one results format, one suite per chapter.

    python -m dispatch_book.bench SUITE [--out DIR] [args]   # kernels | routing | decode | parallel | ceilings

``time_ms``/``rel_err`` (harness), ``save``/``load``/``provenance`` (results files; the recordings
ship as the package data ``dispatch_book.results``), ``ceilings`` (the "% of peak" denominators).
"""
from dispatch_book.bench.core import (  # noqa: F401
                                      add_output_args,
                                      ceilings,
                                      configure,
                                      git_commit,
                                      gpu_slug,
                                      int_list,
                                      load,
                                      main,
                                      preset_list,
                                      provenance,
                                      rel_err,
                                      save,
                                      time_ms,
)
