"""Chapter 5's balancing study: four short trainings of the tiny OLMoE, one results file.

    python -m dispatch_book.bench balance_study [--threads 1] --out results   # ~1-2 min a run on 2 cores

The runs differ only in how they balance the experts: none, the Switch auxiliary loss at 0.01 and
0.1, and the loss-free bias of DeepSeek-V3. Each row holds one run's configuration, final metrics
and curves; the file is ``<out>/<device>/balance_study.json`` (a CPU run: ``cpu``).
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import tempfile

from dispatch import train
from dispatch_book.bench import results

STUDY = {  # label → overrides of the "study" preset
    "none": {"balance": "none"},
    "aux 0.01": {"balance": "aux", "aux_coef": 0.01},
    "aux 0.1": {"balance": "aux", "aux_coef": 0.1},
    "bias (loss-free)": {"balance": "bias"},
}


def rows_of(logs: dict[str, dict]) -> list[dict]:
    """label → training log (``train.run``'s return) as results rows."""
    return [{"label": k, "config": log["config"], "final": log["final"], "curves": log["curves"],
             "train_seconds": log["train_seconds"]} for k, log in logs.items()]


def run(threads: int | None = None) -> dict[str, dict]:
    """The four runs; returns label → training log."""
    logs = {}
    for label, over in STUDY.items():
        cfg = dataclasses.replace(train.PRESETS["study"], **over, **({"threads": threads} if threads else {}))
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in over.items())
        with tempfile.TemporaryDirectory() as d:
            logs[label] = train.run(cfg, pathlib.Path(d), command=f"python -m dispatch.train --preset study {flags}")
    return logs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench balance_study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, help="torch threads (1 is faster on a busy 2-core machine)")
    results.add_output_args(ap)
    a = ap.parse_args(argv)
    results.checked_commit(a.allow_dirty)  # refuse before ten minutes of training, not after
    logs = run(a.threads)
    first = next(iter(logs.values()))
    print("wrote", results.save("balance_study", rows_of(logs), out=a.out, allow_dirty=a.allow_dirty,
                                extra={"manifest_hash": first["manifest_hash"]}))
