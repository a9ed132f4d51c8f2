"""The one results format: ``save`` writes it, ``load`` reads it, ``provenance`` tells it.

A results file is ``<root>/<gpu-slug>/<name>.json``::

    {"benchmark": name, "schema": 1, "gpu": "NVIDIA H200", "gpu_count": 1,
     "versions": {"python", "torch", "triton", "transformers"}, "git_commit": "<40 hex>",
     "date": "<UTC ISO 8601>", "command": "python -m dispatch_book.bench ...", ...extra,
     "rows": [{what was measured..., "median_ms", "min_ms", "max_ms", "samples"}, ...]}

Every row is a flat dict: the case's keys, then the fields of ``time_ms`` (raw medians, in ms).
A recording re-measured at some sizes only (``save(..., merge=True)``, e.g. the kernels race at
T ≤ 64 after a decode change) keeps the file's rows at the other sizes and lists its runs in
``"parts"``: one ``{"sizes": [[shape, tokens], ...], "git_commit", "date", "command"}`` per run
(:func:`merged`; a size is [shape, tokens, routing] for a routing other than uniform); its
top-level fields are the newest run's.

Where files go and come from:

* The book reads the recordings shipped with the package: the repository's ``results/`` folder is
  the package data ``dispatch_book.results`` (read with ``importlib.resources``, so the same code
  works from a checkout, an editable install and a wheel).
* ``save`` writes under ``out``: by default the scratch folder ``_build/results`` of the current
  directory, so a benchmark run never replaces a recording by accident. Recording for the book is
  asked for explicitly: ``python -m dispatch_book.bench SUITE --out results``.
* ``save`` refuses a run whose code it cannot name: outside a git checkout set
  ``DISPATCH_GIT_COMMIT``; a checkout with uncommitted changes to the package is refused unless
  ``allow_dirty`` (``--allow-dirty``) — such a file records ``<commit>+dirty``.
"""
from __future__ import annotations

import datetime as _dt
import importlib.resources
import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import torch

from dispatch import files, runtime

SCRATCH = pathlib.Path("_build") / "results"
PACKAGE = "dispatch_book.results"
_COMMIT = re.compile(r"^[0-9a-f]{7,40}(\+dirty)?$")
# What the command line (``python -m dispatch_book.bench SUITE --out DIR --allow-dirty``) set for
# every ``save`` of the run; explicit arguments of ``save`` win.
_cli: dict = {"out": None, "allow_dirty": False}


def configure(out: str | os.PathLike | None = None, allow_dirty: bool = False) -> None:
    """Set the defaults of ``save`` for this process (what the CLI's ``--out``/``--allow-dirty`` do)."""
    _cli.update(out=out, allow_dirty=allow_dirty)


def add_output_args(parser) -> None:
    """``--out DIR`` and ``--allow-dirty``: the one spelling of where a benchmark writes."""
    parser.add_argument("--out", default=_cli["out"], metavar="DIR",
                        help=f"results root: the file goes to DIR/<gpu>/NAME.json (default {SCRATCH}, a scratch "
                             "folder; `--out results` replaces the recording the book reads)")
    parser.add_argument("--allow-dirty", action="store_true", default=_cli["allow_dirty"],
                        help="record a run of uncommitted code (its commit is marked +dirty)")


def int_list(text: str) -> list[int]:
    """argparse type of ``--tokens 1,8,64``: positive ints, or a usage error naming the bad item."""
    import argparse

    out = []
    for item in text.split(","):
        try:
            out.append(int(item))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated positive integers (e.g. 1,8,64), "
                                             f"got {item!r} in {text!r}") from None
        if out[-1] < 1:
            raise argparse.ArgumentTypeError(f"expected positive integers, got {out[-1]} in {text!r}")
    return out


def preset_list(text: str) -> list[str]:
    """argparse type of ``--shapes olmoe-1b-7b,mixtral-8x7b``: names of :data:`dispatch.config.PRESETS`."""
    import argparse

    from dispatch.config import PRESETS

    names = [n for n in text.split(",") if n]
    bad = [n for n in names if n not in PRESETS]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown preset {', '.join(map(repr, bad)) or repr(text)}; choose from "
                                         f"{', '.join(sorted(PRESETS))}")
    return names


def gpu_slug(name: str | None = None) -> str:
    """Folder name of a GPU: ``"NVIDIA H200"`` → ``h200``, ``"Tesla T4"`` → ``tesla-t4``; the
    current device's when ``name`` is None (``cpu`` without CUDA)."""
    if name is None:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return re.sub(r"[^a-z0-9]+", "-", name.lower().replace("nvidia", "")).strip("-") or "cpu"


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """The commit the code was run from: ``$DISPATCH_GIT_COMMIT`` (a tree copied without .git),
    else ``HEAD`` of the checkout around ``cwd`` (``+dirty`` when ``dispatch/`` or ``dispatch_book/``
    differ from it), else ``"unknown"``."""
    env = os.environ.get("DISPATCH_GIT_COMMIT", "").strip()
    if env:
        return env
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--", ":/dispatch", ":/dispatch_book"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty else "")


class CommitError(ValueError):
    """The run's code cannot be named by a clean commit."""


def checked_commit(allow_dirty: bool = False, cwd: str | os.PathLike | None = None) -> str:
    """``git_commit()``, or a ValueError when it cannot be trusted (unknown, malformed, or dirty
    without ``allow_dirty``)."""
    commit = git_commit(cwd)
    if commit == "unknown":
        raise CommitError("cannot tell which commit this run measures: run it from a git checkout, or set "
                         "DISPATCH_GIT_COMMIT=<commit> where the tree was copied without .git")
    if not _COMMIT.match(commit):
        raise CommitError(f"DISPATCH_GIT_COMMIT must be a hex commit id (optionally +dirty), got {commit!r}")
    if commit.endswith("+dirty") and not allow_dirty:
        raise CommitError(f"the package has uncommitted changes ({commit}): commit them first, or pass "
                         "--allow-dirty (save(..., allow_dirty=True)) to record a run of a dirty tree")
    return commit


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would type it (``python -m MODULE args``), without ``--out DIR``."""
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = ["python", "-m", spec.name.removesuffix(".__main__")] if spec is not None else ["python", argv[0]]
    args, skip = [], False
    for a in argv[1:]:
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        args.append(a)
    return " ".join(head + args)


def save(name: str, rows: list[dict], *, out: str | os.PathLike | None = None, command: str | None = None,
         extra: dict | None = None, allow_dirty: bool | None = None, merge: bool = False) -> pathlib.Path:
    """Write ``<out>/<gpu-slug>/<name>.json`` (default ``out``: ``_build/results``); returns the path.
    ``merge``: keep the rows of the file there at the (shape, tokens) sizes this run did not measure
    (:func:`merged`)."""
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"a results name is lower-case letters, digits and '_', got {name!r}")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"rows must be a non-empty list of dicts, got {type(rows).__name__} {rows!r:.80}")
    allow_dirty = _cli["allow_dirty"] if allow_dirty is None else allow_dirty
    commit = checked_commit(allow_dirty)
    info = runtime.describe()
    doc = {
        "benchmark": name,
        "schema": 1,
        "gpu": info.get("gpu") or "cpu",
        "gpu_count": info.get("gpu_count", 0),
        "versions": {k: info.get(k) for k in ("python", "torch", "triton", "transformers")},
        "git_commit": commit,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command or command_line(),
        **(extra or {}),
        "rows": rows,
    }
    folder = pathlib.Path(out if out is not None else _cli["out"] or SCRATCH).absolute() / gpu_slug(doc["gpu"])
    path = folder / f"{name}.json"
    if merge and path.is_file():
        doc = merged(doc, json.loads(path.read_text()))
    text = json.dumps(doc, indent=1) + "\n"  # serialise first: a bad row never leaves half a file
    return files.write_text(path, text)  # whole or not at all


_SAME = ("benchmark", "gpu", "gpu_count", "versions", "ceilings")  # what one merged recording must share


class CannotMerge(ValueError):
    """A run that cannot join the recorded file (another GPU, software or ceilings): record it whole."""


def _size(row: dict) -> tuple:
    """What a merge keys rows by: (shape, tokens), and the routing where it is not uniform
    (``dispatch_book.bench.skew``: a skewed file may hold several routings); a suite without shapes
    by the row's part (``serve``: step, offline, online, reliability); a suite of kinds of rows per
    model without token counts (``speculative``, ``step_kernels``) by (model, kind)."""
    routing = row.get("routing", "uniform")
    size = (row.get("shape", row.get("part")), row.get("tokens"))
    if routing != "uniform":
        return size + (routing,)
    if "kind" in row and "tokens" not in row:  # suites of kinds per model: by kind
        return size + ("kind", row["kind"])
    return size


def commit_of(doc: dict, row: dict) -> str | None:
    """The commit a recording's row was measured at: its run's in ``"parts"`` (a merged file), else the file's.
    Ratios between rows are only ratios where both rows have the same."""
    size = _size(row)
    for p in doc.get("parts") or ():
        if any(tuple(s) == size for s in p["sizes"]):
            return p["git_commit"]
    return doc.get("git_commit")


def _part(doc: dict) -> dict:
    return {"sizes": sorted({_size(r) for r in doc["rows"]}, key=str), "git_commit": doc["git_commit"],
            "date": doc["date"], "command": doc["command"]}


def merged(new: dict, old: dict) -> dict:
    """``new`` plus the rows of ``old`` at the (shape, tokens) sizes ``new`` did not measure, with
    ``"parts"``: which sizes each run measured (``old``'s parts, less what ``new`` re-measured, after
    ``new``'s own). ValueError, naming the field, when the two are not one benchmark on one GPU and
    software, divided by the same ceilings: then every size must be recorded again."""
    for f in _SAME:
        if old.get(f) != new.get(f):
            raise CannotMerge(f"cannot merge into the recorded {old.get('benchmark')!r} file: its {f} is "
                              f"{old.get(f)!r:.120}, this run's {new.get(f)!r:.120}; record every size again")
    def measured(doc):
        return {_size(r) for r in doc["rows"] if "skipped" not in r}
    # a size this run only skipped (time budget) keeps the recording's measured rows of it
    ours, theirs = measured(new), measured(old)
    rows = [r for r in new["rows"] if "skipped" not in r or _size(r) in ours or _size(r) not in theirs]
    new = {**new, "rows": rows}
    done = {_size(r) for r in rows}
    kept = [r for r in old["rows"] if _size(r) not in done]
    if not kept:
        return new
    parts = [_part(new)]
    for p in old.get("parts") or [_part(old)]:
        left = [s for s in p["sizes"] if tuple(s) not in done]
        if left:
            parts.append({**p, "sizes": left})
    return {**new, "parts": parts, "rows": new["rows"] + kept}


def _sizes_text(sizes: list, all_shapes: set) -> str:
    """"T = 1, 8, 64", plus "for SHAPES" when the run measured some of the recording's shapes only."""
    tokens = sorted({s[1] for s in sizes if s[1] is not None})
    shapes = sorted({s[0] for s in sizes if s[0] is not None})
    if not tokens:  # parts of a suite without sizes (serve), or of kinds per model (speculative)
        kinds = {sh: sorted({s[3] for s in sizes if len(s) == 4 and s[0] == sh}) for sh in shapes}
        return ", ".join(f"{sh} ({', '.join(kinds[sh])})" if kinds[sh] else sh for sh in shapes)
    routings = sorted({s[2] for s in sizes if len(s) == 3})
    text = f"T = {', '.join(map(str, tokens))}" + (f" ({', '.join(routings)} routing)" if routings else "")
    return text if set(shapes) >= all_shapes else f"{text} for {', '.join(shapes)}"


def recorded():
    """The recordings shipped with the package (an ``importlib.resources`` Traversable).

    Where the package is imported from a checkout that was never installed (``PYTHONPATH=.``),
    ``dispatch_book.results`` does not exist: then the ``results/`` folder of the checkout around
    the current directory is read instead."""
    try:
        return importlib.resources.files(PACKAGE)
    except ModuleNotFoundError:
        for d in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents):
            if (d / "setup.py").is_file() and (d / "dispatch_book").is_dir() and (d / "results").is_dir():
                return d / "results"
        raise FileNotFoundError("the recorded results ship as the package data dispatch_book.results: install the "
                                "package (pip install .), or run from a checkout of the repository") from None


def load(name: str, gpu: str | None = None, *, root: str | os.PathLike | None = None) -> dict | None:
    """The recorded file of benchmark ``name``: of GPU ``gpu`` (a name or slug: ``"h200"``) when given,
    else of the set the chapters read here (:func:`dispatch_book.bench.sets.current`: this GPU's complete
    set, else ``$DISPATCH_RESULTS_GPU`` or the newest complete one; an optional suite the set lacks comes
    from the GPU that recorded it last, :func:`~dispatch_book.bench.sets.optional_slug`); None when there is none.

    Only a file whose recorded ``gpu`` is the folder's GPU counts, and CPU runs (``cpu*`` folders) are
    read only when asked for by name (``gpu="cpu"``): a CPU run never stands in for a GPU. A recording
    of uncommitted code (``+dirty``) is refused: it cannot be reproduced. A benchmark outside the set
    (``sets.SET``) must name its GPU. ``root``: another results folder (e.g. ``_build/results``).
    """
    from dispatch_book.bench import sets

    base = pathlib.Path(root) if root is not None else recorded()
    if gpu is None:
        if name not in sets.SET and name not in sets.OPTIONAL:
            raise ValueError(f"{name!r} is not one of the recordings of a set ({', '.join(sets.SET)}): name "
                             f"the GPU it was recorded on, load({name!r}, gpu=...)")
        slug = sets.optional_slug(name, root) if name in sets.OPTIONAL else sets.current(root)
        if slug is None:
            return None
    else:
        slug = gpu_slug(gpu)
    f = base.joinpath(slug, f"{name}.json")
    if not f.is_file():
        return None
    doc = json.loads(f.read_text())
    if gpu_slug(doc.get("gpu") or "cpu") != slug:
        return None
    dirty = [c for c in [doc.get("git_commit", "")] + [p["git_commit"] for p in doc.get("parts") or []]
             if c.endswith("+dirty")]
    if dirty:
        raise ValueError(f"results/{slug}/{name}.json was recorded from uncommitted code (commit {dirty[0]}): "
                         f"it cannot be reproduced; record it again from a commit")
    return doc


def provenance(doc: dict, label: str | None = None) -> str:
    """One sentence saying where and when a recorded file was measured, wrapped to the book's column;
    ``label`` (e.g. the file's name) leads it, inside the wrapping."""
    if not isinstance(doc, dict):
        raise ValueError("provenance() needs a results document; load() found no recorded file")
    v, on = doc["versions"], f"Recorded on {doc.get('gpu_count') or 1}x {doc['gpu']}"
    software = f"torch {v['torch']}, triton {v['triton']}, transformers {v['transformers']}"
    if not doc.get("parts"):
        text = (f"{on} on {doc['date'][:10]} ({software}, commit {doc['git_commit']}) "
                f"by `{doc['command']}`.")
    else:  # merged from runs at different commits: which sizes each run measured
        shapes = {r.get("shape") for r in doc["rows"]} - {None}
        runs = "; ".join(f"{_sizes_text(p['sizes'], shapes)} on {p['date'][:10]} at commit "
                         f"{p['git_commit']} by `{p['command']}`" for p in doc["parts"])
        text = f"{on} ({software}) in {len(doc['parts'])} runs: {runs}."
    if label:
        text = f"{label}: {text}"
    text = textwrap.fill(text, width=88, break_on_hyphens=False)  # the book's text column
    from dispatch_book.bench import evidence

    note = evidence.stale_note(doc)
    return text if note is None else f"{text}\n{textwrap.fill(note, width=88, break_on_hyphens=False)}"
