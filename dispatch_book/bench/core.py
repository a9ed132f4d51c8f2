"""One benchmark harness and one results format for the whole book, and the suites' CLI.

The harness is :mod:`dispatch_book.bench.harness` (``time_ms``, ``rel_err``); the results files
are :mod:`dispatch_book.bench.results` (``save``, ``load``, ``provenance``); the ceilings every
"% of peak" divides by are :mod:`dispatch_book.bench.peaks` (``ceilings``).

    python -m dispatch_book.bench SUITE [--out DIR] [--allow-dirty] [suite args]

runs a registered suite. ``--out DIR`` is where every results file of the run goes
(``DIR/<gpu>/NAME.json``); without it they go to the scratch folder ``_build/results``, so the
recordings under ``results/`` change only when asked: ``--out results``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from dispatch_book.bench.harness import rel_err, time_ms  # noqa: F401
from dispatch_book.bench.peaks import ceilings  # noqa: F401
from dispatch_book.bench.results import (  # noqa: F401
    CommitError,
    add_output_args,
    configure,
    git_commit,
    gpu_slug,
    int_list,
    load,
    preset_list,
    provenance,
    save,
)

# Suites: name -> module with a ``main(argv)``.
SUITES = {
    "kernels": "dispatch_book.bench.kernels",
    "kernels_sweep": "dispatch_book.bench.kernels_sweep",
    "routing": "dispatch_book.bench.routing",
    "decode": "dispatch_book.bench.decode",
    "parallel": "dispatch_book.bench.parallel",
    "ceilings": "dispatch_book.bench.peaks",
    "reads": "dispatch_book.bench.reads",
    "chain": "dispatch_book.bench.chain",
    "balance_study": "dispatch_book.bench.balance_study",
    "e2e": "dispatch_book.bench.e2e",
    "quant": "dispatch_book.bench.quant",
    "step_kernels": "dispatch_book.bench.step_kernels",
    "timeline": "dispatch_book.bench.timeline",
    "split": "dispatch_book.bench.split",
    "serve": "dispatch_book.bench.serve",
    "speculative": "dispatch_book.bench.speculative",
    "disagg": "dispatch_book.bench.disagg",
    "disagg_ipc": "dispatch_book.bench.disagg_ipc",
    "evidence": "dispatch_book.bench.evidence",
    "all": "dispatch_book.bench.record",
}


def parse(argv: list[str]) -> tuple[str, argparse.Namespace, list[str]]:
    """``SUITE [--out DIR] [--allow-dirty] rest`` → (suite, the common options, the suite's own args)."""
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench", allow_abbrev=False, add_help=False,
                                 description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=sorted(SUITES))
    add_output_args(ap)
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        raise SystemExit(0 if argv else 2)
    common, rest = ap.parse_known_args(argv)
    return common.suite, common, rest


def main(argv: list[str] | None = None) -> None:
    suite, common, rest = parse(list(sys.argv[1:] if argv is None else argv))
    configure(out=common.out, allow_dirty=common.allow_dirty)
    try:
        importlib.import_module(SUITES[suite]).main(rest)
    except CommitError as e:
        raise SystemExit(f"not saved: {e}") from None


if __name__ == "__main__":
    main()
