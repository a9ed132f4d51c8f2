"""Benchmarks: one harness, one results format (``core``), and one suite per chapter.

    python -m dispatch_book.bench SUITE [args]     # kernels | routing | decode | parallel | ceilings
"""
from dispatch_book.bench.core import (gpu_slug, git_commit, load, main, provenance, rel_err,  # noqa: F401
                                      save, time_ms)
