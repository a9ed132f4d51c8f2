"""Chapter 5's balancing study: short trainings of the tiny OLMoE, several seeds, one results file.

    python -m dispatch_book.bench balance_study --threads 1 --out results   # ~2-3 min a run on a core

The settings differ only in how they balance the experts: none, the Switch auxiliary loss at 0.01
and 0.1, and the loss-free bias of DeepSeek-V3. Each setting is trained once per seed (``--seeds``,
default 0 1 2); a seed fixes the model's initialisation and the order of the training batches,
so the settings of one seed start from the same weights and see the same batches. Each row holds
one run's setting, seed, configuration, final metrics and curves (the study's log); the file is
``<out>/<device>/balance_study.json`` (a CPU run: ``cpu``). ``summarize`` reduces the rows to
mean, spread and per-seed values for each setting.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
import statistics
import sys
import tempfile

from dispatch import train
from dispatch_book.bench import results

STUDY = {  # label → overrides of the "study" preset
    "none": {"balance": "none"},
    "aux 0.01": {"balance": "aux", "aux_coef": 0.01},
    "aux 0.1": {"balance": "aux", "aux_coef": 0.1},
    "bias (loss-free)": {"balance": "bias"},
}
SEEDS = (0, 1, 2)
METRICS = {  # summary name → a row's value
    "val_imbalance": lambda r: r["final"]["imbalance"],
    "val_loss": lambda r: math.log(r["final"]["val_ppl"]),
    "val_ppl": lambda r: r["final"]["val_ppl"],
    "train_imbalance": lambda r: r["curves"]["imbalance"][-1],  # the last logged window
}


def rows_of(logs: dict[tuple[str, int], dict]) -> list[dict]:
    """(label, seed) → training log (``train.run``'s return) as results rows."""
    return [{"label": label, "seed": seed, "config": log["config"], "final": log["final"],
             "curves": log["curves"], "train_seconds": log["train_seconds"]}
            for (label, seed), log in logs.items()]


def run(threads: int | None = None, seeds: tuple[int, ...] = SEEDS, preset: str = "study",
        progress: bool = False) -> dict[tuple[str, int], dict]:
    """Every setting of ``STUDY`` once per seed; returns (label, seed) → training log."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"need one or more distinct seeds, got {list(seeds)}")
    logs = {}
    for seed in seeds:
        for label, over in STUDY.items():
            over = {**over, "seed": seed, **({"threads": threads} if threads else {})}
            cfg = dataclasses.replace(train.PRESETS[preset], **over)
            flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in over.items())
            with tempfile.TemporaryDirectory() as d:
                log = train.run(cfg, pathlib.Path(d), progress=progress,
                                command=f"python -m dispatch.train --preset {preset} {flags}")
            logs[label, seed] = log
            f = log["final"]
            print(f"seed {seed} {label}: val ppl {f['val_ppl']}, val imbalance {f['imbalance']}, "
                  f"{log['train_seconds']} s", file=sys.stderr, flush=True)
    return logs


def summarize(rows: list[dict]) -> dict[str, dict]:
    """label → {"seeds": [...], metric → {"mean", "std", "min", "max", "by_seed"}} over seeds.

    ``std`` is the sample standard deviation (0.0 for one seed); ``by_seed`` maps a seed to its
    value, so two settings can be compared seed by seed (same initialisation, same batches)."""
    out: dict[str, dict] = {}
    for r in rows:
        out.setdefault(r["label"], {"rows": []})["rows"].append(r)
    for label, s in out.items():
        rs = sorted(s.pop("rows"), key=lambda r: r["seed"])
        seeds = [r["seed"] for r in rs]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{label!r}: a seed appears twice in {seeds}")
        s["seeds"] = seeds
        for name, get in METRICS.items():
            v = [get(r) for r in rs]
            s[name] = {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
                       "min": min(v), "max": max(v), "by_seed": dict(zip(seeds, v, strict=True))}
    return out


def spread(stat: dict, fmt: str = ".2f") -> str:
    """``"mean (min–max)"`` of one ``summarize`` statistic."""
    return f"{stat['mean']:{fmt}} ({stat['min']:{fmt}}–{stat['max']:{fmt}})"


def paired(summary: dict, a: str, b: str, metric: str) -> dict:
    """Setting ``a`` minus setting ``b`` on ``metric``, seed by seed (the seeds both ran).

    Returns ``{"diffs", "mean", "min", "max", "same_sign", "noise"}``: ``same_sign`` when every
    seed's difference has the sign of the mean (and none is 0); ``noise`` is the largest spread
    (max − min over seeds) of either setting on its own, the seed-to-seed noise to compare with."""
    sa, sb = summary[a][metric], summary[b][metric]
    seeds = [s for s in sa["by_seed"] if s in sb["by_seed"]]
    if not seeds:
        raise ValueError(f"{a!r} and {b!r} share no seed")
    d = [sa["by_seed"][s] - sb["by_seed"][s] for s in seeds]
    mean = statistics.fmean(d)
    return {"diffs": d, "mean": mean, "min": min(d), "max": max(d),
            "same_sign": all(x * mean > 0 for x in d),
            "noise": max(sa["max"] - sa["min"], sb["max"] - sb["min"])}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench balance_study", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, help="torch threads (1 is faster on a busy 2-core machine)")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS),
                    help="training seeds, each setting runs once per seed (default: 0 1 2)")
    results.add_output_args(ap)
    a = ap.parse_args(argv)
    if len(set(a.seeds)) != len(a.seeds):
        ap.error(f"--seeds must be distinct, got {a.seeds}")
    results.checked_commit(a.allow_dirty)  # refuse before an hour of training, not after
    logs = run(a.threads, tuple(a.seeds))
    first = next(iter(logs.values()))
    print("wrote", results.save("balance_study", rows_of(logs), out=a.out, allow_dirty=a.allow_dirty,
                                extra={"manifest_hash": first["manifest_hash"], "seeds": a.seeds}))
