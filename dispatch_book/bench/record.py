"""Record a whole set: every recording the chapters read, on the GPU at hand, from one commit.

    python -m dispatch_book.bench all --out results [--budget-s 570] [--only kernels,quant] [--list]
    make record-gpu                                  # the same, on a GPU machine

Runs the steps of :data:`PLAN` in order, each in a process of its own (a crash or an out-of-memory in
one does not stop the others), and skips a step whose recordings ``<out>/<gpu>/`` already holds from
this commit (``<out>/<gpu>/_record.json`` logs each step's outcome and seconds): run it again, in as
many calls as it takes, until it prints "complete". A step starts only if its expected time (its
seconds in this GPU's record log, else :data:`PLAN`'s guess)
fits what is left of ``--budget-s``; a step that runs past the budget is stopped, and the suites save
after every row or shape, so what they measured is kept. Refuses a tree with uncommitted changes and
records the full commit (``DISPATCH_GIT_COMMIT`` where the tree was copied without ``.git``).
``--with-tests LOG`` runs the ``-m gpu`` tests beside the book step (neither is a timing). A set may
span commits where the GPU comes in pieces: ``--reuse-fresh`` (on a git checkout) counts a step done from
an earlier commit when nothing it measures changed since, and the kernels race, one layer a step, merges
into the runs of earlier commits while they stay fresh (:func:`keeps`); ``make evidence`` checks each run.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from dataclasses import dataclass

from dispatch import files
from dispatch_book.bench import results, sets


@dataclass(frozen=True)
class Step:
    name: str          # the step
    argv: tuple        # the suite and its arguments (`python -m dispatch_book.bench ...`)
    guess_s: float     # expected seconds where this GPU has no record of it yet
    writes: tuple = () # the recordings it writes (default: its name)
    merges: bool = False  # adds its rows to the recording of earlier steps and commits (keeps)

    @property
    def files(self) -> tuple:
        return self.writes or (self.name,)


_SHAPES = ("olmoe-1b-7b", "qwen3-30b-a3b", "deepseek-moe-16b", "mixtral-8x7b")
PLAN = (
    Step("ceilings", ("ceilings",), 45),
    Step("reads", ("reads",), 45),
    Step("routing_sort", ("routing",), 90),
    Step("decode_chain", ("chain",), 60),
    Step("decode", ("decode",), 200),
    # the kernels race one layer a step (merged into one file): a call never has to fit all four
    *(Step(f"kernels:{s}", ("kernels", "--shapes", s, "--merge"), 200, writes=("kernels",), merges=True)
      for s in _SHAPES),
    Step("kernels_sweep", ("kernels_sweep",), 120),
    Step("step_kernels", ("step_kernels",), 80),
    Step("e2e", ("e2e", "--profile", "--budget-s", "150"), 190, writes=("e2e", "e2e_profile")),
    Step("quant", ("quant", "--quick", "--shapes", ",".join(_SHAPES)), 200),
    # chapter 8 in two steps, each part's rows merged by part into one file (results.merged)
    Step("serve:step,offline", ("serve", "--parts", "step,offline", "--budget-s", "440"), 470,
         writes=("serve",), merges=True),
    Step("serve:online,reliability", ("serve", "--parts", "online,reliability", "--budget-s", "500",
                                      "--reliability-n", "2000"), 530, writes=("serve",), merges=True),
    # chapter 9: invariance cost, step costs per k, the race and the presets' replays (rows kept per model)
    Step("speculative", ("speculative", "--part", "gpu", "--budget-s", "520"), 560, merges=True),
    Step("book_gpu", ("book",), 420),  # no chapter reads it: recorded last, not needed for a complete set
)
PLAN_FILES = tuple(dict.fromkeys(f for s in PLAN for f in s.files))
assert set(PLAN_FILES) >= set(sets.SET), "PLAN must record the whole set"
LOG = "_record.json"  # per set folder: which steps finished, from which commit, in how many seconds


def _doc(folder: pathlib.Path, name: str) -> dict | None:
    f = folder / f"{name}.json"
    return json.loads(f.read_text()) if f.is_file() else None


def log(folder: pathlib.Path) -> dict:
    """The set's record log: ``{"gpu", "steps": {step: {"git_commit", "wall_s", "date", "exit"}}}`` — each
    step's last run."""
    f = folder / LOG
    return json.loads(f.read_text()) if f.is_file() else {"steps": {}}


def done(step: Step, folder: pathlib.Path, commit: str, reuse_fresh: bool = False) -> bool:
    """``step``'s last run finished (exit 0) and its recordings are there, from ``commit`` — or, with
    ``reuse_fresh`` (a git checkout), from a commit after which nothing it measures has changed."""
    entry = log(folder)["steps"].get(step.name, {})
    if entry.get("exit") != 0 or not all((folder / f"{n}.json").is_file() for n in step.files):
        return False
    if entry.get("git_commit") == commit:
        return True
    if not reuse_fresh:
        return False
    return _changed_since(step, entry["git_commit"]) == ()


def _changed_since(step: Step, commit: str) -> tuple[str, ...] | None:
    """What changed since ``commit`` in the code ``step``'s recordings measure (None: no git checkout, or
    ``commit`` is not in it)."""
    from dispatch_book.bench import evidence

    return evidence.changed(commit, tuple(dict.fromkeys(p for n in step.files for p in sets.measured_paths(n))))


def keeps(step: Step, doc: dict, commit: str) -> bool:
    """Whether ``step``, run at ``commit``, adds to the recording ``doc`` rather than replacing it. A step
    that merges (the kernels race one layer a step, serving two parts a step) keeps the runs of other commits
    while nothing they measured has changed since: a later step must not erase the earlier steps' fresh rows. Where
    this is no git checkout (a GPU machine gets a copy of the tree) freshness cannot be told here, so the
    runs are kept and the evidence check, on the checkout, names any that turned stale. Any other step's
    recording of another commit is replaced."""
    others = [p["git_commit"] for p in doc.get("parts") or [doc] if p["git_commit"] != commit]
    if not others:
        return True
    if not step.merges or any(c.endswith("+dirty") for c in others):
        return False
    return all(_changed_since(step, c) in ((), None) for c in dict.fromkeys(others))


SLACK = 1.2  # a step takes up to a fifth longer than last time at another commit (new code, new compiles)


def expected_s(step: Step, folder: pathlib.Path) -> float:
    """The step's seconds in this GPU's last record, else the plan's guess; a run stopped at its time
    limit (exit 124) needed more than it had: half as much again, and never less than the guess."""
    entry = log(folder)["steps"].get(step.name, {})
    wall = float(entry.get("wall_s") or step.guess_s)
    return max(1.5 * wall, step.guess_s) if entry.get("exit") == 124 else wall


def finish(step: Step, folder: pathlib.Path, commit: str, seconds: float, rc: int) -> None:
    """Write the step's outcome (its commit, seconds and exit status) into the record log."""
    import datetime

    entry = log(folder)
    entry["gpu"] = results.gpu_slug()
    entry["steps"][step.name] = {"git_commit": commit, "wall_s": round(seconds, 1), "exit": rc,
                                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    files.write_text(folder / LOG, json.dumps(entry, indent=1) + "\n")


def _command(step: Step, out: str) -> list[list[str]]:
    py = sys.executable
    if step.name == "book_gpu":  # both budgets at once: chapters' seconds are then upper bounds
        return [[py, "-m", "dispatch_book.build", "--gpu", "--out", out],
                [py, "-m", "dispatch_book.build", "--gpu", "--t4-budget", "--out", out]]
    return [[py, "-m", "dispatch_book.bench", step.argv[0], "--out", out, *step.argv[1:]]]


def run_step(step: Step, out: str, limit_s: float, tests_log: str | None = None) -> int:
    """Run one step's processes (at once) with a time limit; returns the worst exit status."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen(c, env=env) for c in _command(step, out)]
    if tests_log and step.name == "book_gpu":
        with open(tests_log, "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "pytest", "tests", "-m", "gpu", "-q", "-rf",
                                           "-p", "no:cacheprovider"], stdout=log, stderr=subprocess.STDOUT, env=env))
    deadline, worst = time.time() + limit_s, 0
    for p in procs:
        try:
            worst = max(worst, p.wait(timeout=max(1.0, deadline - time.time())))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            worst = max(worst, 124)
    return worst


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench all", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    results.add_output_args(ap)
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock seconds for this call")
    ap.add_argument("--only", default=None, help="comma-separated steps (default: all of them)")
    ap.add_argument("--list", action="store_true", help="print the plan and what is recorded, run nothing")
    ap.add_argument("--with-tests", default=None, metavar="LOG", help="run `pytest -m gpu` beside the book step")
    ap.add_argument("--reuse-fresh", action="store_true", help="in a git checkout: keep a step recorded at an "
                    "earlier commit when nothing it measures changed since (the set then spans commits)")
    a = ap.parse_args(argv)
    steps = PLAN if a.only is None else [s for s in PLAN if s.name in a.only.split(",")]
    if a.only and len(steps) != len(a.only.split(",")):
        raise SystemExit(f"--only takes steps of {', '.join(s.name for s in PLAN)}; got {a.only!r}")
    if a.allow_dirty:
        raise SystemExit("a set is recorded from a commit: --allow-dirty is refused here")
    commit = results.checked_commit(False)
    if len(commit) != 40:
        raise SystemExit(f"record the full commit (40 hex digits), got {commit!r}")
    out = a.out or str(results.SCRATCH)
    folder = pathlib.Path(out) / results.gpu_slug()
    t0 = time.time()
    todo = [s for s in steps if not done(s, folder, commit, a.reuse_fresh)]
    print(f"set {folder} at {commit}: {len(steps) - len(todo)} of {len(steps)} steps recorded", flush=True)
    for s in steps:
        print(f"  {s.name:<26} {'recorded' if s not in todo else f'~{expected_s(s, folder):.0f} s'}")
    if a.list:
        return
    for s in todo:
        left = a.budget_s - (time.time() - t0)
        if SLACK * expected_s(s, folder) > left:  # a step is cut off at the budget and records nothing whole
            print(f"stop: {s.name} needs ~{expected_s(s, folder):.0f} s (and {SLACK - 1:.0%} to spare), "
                  f"{left:.0f} s left", flush=True)
            break
        for name in s.files:
            doc = _doc(folder, name)
            if doc and not keeps(s, doc, commit):
                (folder / f"{name}.json").unlink()
        print(f"== {s.name} ({left:.0f} s left)", flush=True)
        t_step = time.time()
        rc = run_step(s, out, left, a.with_tests)
        finish(s, folder, commit, time.time() - t_step, rc)
        print(f"== {s.name}: exit {rc} after {time.time() - t_step:.0f} s", flush=True)
    left = [s.name for s in steps if not done(s, folder, commit, a.reuse_fresh)]
    print("complete: every step recorded" if not left else f"not yet recorded: {', '.join(left)} (run again)")
