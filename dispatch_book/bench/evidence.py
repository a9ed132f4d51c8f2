"""Is the evidence current? Which recordings the chapters read, and which are stale, dirty or missing.

    python -m dispatch_book.bench evidence        # lists every set; exits 1 on a hard failure

A recording is *stale* when code it measured (``sets.MEASURES``) changed in a commit after the one it
was recorded at: the chapters still read it, and :func:`stale_note` (added to every
``provenance(...)``) says so on the page. It *fails* the check when it was recorded from uncommitted
code (``+dirty``), names a commit that is not in the history of ``HEAD``, or a chapter reads it and it
is not there. Needs a git checkout; without one (an installed wheel) nothing is called stale.
"""
from __future__ import annotations

import argparse
import functools
import json
import pathlib
import re
import subprocess
import sys

from dispatch_book.bench import results, sets

# bench.load("name") / bench.load("name", gpu="h200") in a chapter's code cells
_LOAD = re.compile(r"""\b(?:bench|results)\.load\(\s*["'](\w+)["']\s*(?:,\s*gpu\s*=\s*["']([^"']+)["'])?""")
# sets.recordings("name"): the recording from every GPU that holds one (none may yet)
_EACH = re.compile(r"""\bsets\.recordings\(\s*["'](\w+)["']""")
EVERY_GPU = "*"


def _git(repo: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, errors="replace",
                          timeout=60)


@functools.lru_cache(maxsize=1)
def repo() -> pathlib.Path | None:
    """The git checkout the recordings live in (None for an installed package or without git)."""
    try:
        here = pathlib.Path(str(results.recorded()))
    except FileNotFoundError:
        return None
    if not here.is_dir():
        return None
    try:
        top = _git(here, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):
        return None
    return pathlib.Path(top.stdout.strip()) if top.returncode == 0 else None


def _code_cells(text: str) -> list[str]:
    try:
        return ["".join(c.get("source", "")) for c in json.loads(text)["cells"] if c.get("cell_type") == "code"]
    except (ValueError, KeyError, TypeError):
        return [text]


def changed(commit: str, paths: tuple[str, ...], top: pathlib.Path | None = None) -> tuple[str, ...] | None:
    """The files under ``paths`` whose code differs between ``commit`` and ``HEAD`` (a notebook counts only
    when its code cells differ, a Python file not for docstrings or comments); None when ``commit`` is not in
    this checkout. A Python file added since counts only through a file that imports it: new code reaches a
    measurement only by an edit to code that was there."""
    top = top or repo()
    if top is None or _git(top, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        return None
    return _changed(commit, _git(top, "rev-parse", "HEAD").stdout.strip(), paths, top)


@functools.lru_cache(maxsize=256)
def _changed(commit: str, head: str, paths: tuple[str, ...], top: pathlib.Path) -> tuple[str, ...]:
    diff = _git(top, "diff", "--name-only", commit, head, "--", *paths).stdout.split()
    out = []
    for f in diff:
        if not f.endswith((".py", ".ipynb")):  # data, weights, tables: any change counts
            out.append(f)
            continue
        old, new = _git(top, "show", f"{commit}:{f}"), _git(top, "show", f"{head}:{f}")
        if f.endswith(".py") and old.returncode != 0 and new.returncode == 0:
            continue  # added: nothing measured imported it then, and what imports it now shows as changed
        if old.returncode == 0 and new.returncode == 0 and _same_code(f, old.stdout, new.stdout):
            continue
        out.append(f)
    return tuple(out)


def _same_code(path: str, old: str, new: str) -> bool:
    """Two versions of a file do the same: a notebook's code cells are equal, a Python file's syntax tree
    is equal once docstrings are left out (comments and docstrings measure nothing)."""
    if path.endswith(".ipynb"):
        return _code_cells(old) == _code_cells(new)
    if path.endswith(".py"):
        try:
            return _tree(old) == _tree(new)
        except SyntaxError:
            return False
    return False


def _tree(src: str) -> str:
    import ast

    tree = ast.parse(src)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def _commits(doc: dict) -> list[tuple[str, str]]:
    """(commit, date) of every run a recording holds (one, or one per merged part)."""
    runs = doc.get("parts") or [doc]
    return [(p["git_commit"], p["date"][:10]) for p in runs]


def _summary(files: tuple[str, ...], paths: tuple[str, ...]) -> str:
    """The measured paths (``sets.MEASURES`` entries) that hold a changed file."""
    hit = [p for p in paths if any(f == p or f.startswith(p.rstrip("/") + "/") for f in files)]
    return ", ".join(hit)


def stale_note(doc: dict) -> str | None:
    """"Recorded at <commit>, <date>; <what> changed since." for a stale recording, else None (also when
    this is no git checkout, or the recording is not one the book knows)."""
    name = doc.get("benchmark")
    try:
        paths = sets.measured_paths(name)
    except ValueError:
        return None
    notes = []
    for commit, date in _commits(doc):
        files = changed(commit.removesuffix("+dirty"), paths)
        if files:
            notes.append(f"recorded at {commit[:12]}, {date}; {_summary(files, paths)} changed since")
    if not notes:
        return None
    return "Stale: " + "; ".join(dict.fromkeys(notes)) + "."


def reads(notebooks: pathlib.Path) -> dict[tuple[str, str | None], list[str]]:
    """(name, gpu or None for the set, or :data:`EVERY_GPU` for ``sets.recordings``) → the chapters whose code
    cells load that recording."""
    out: dict = {}
    for nb in sorted(notebooks.glob("*.ipynb")):
        for src in _code_cells(nb.read_text()):
            for name, gpu in _LOAD.findall(src):
                out.setdefault((name, gpu or None), []).append(nb.stem)
            for name in _EACH.findall(src):
                out.setdefault((name, EVERY_GPU), []).append(nb.stem)
    return {k: sorted(set(v)) for k, v in out.items()}


def check(top: pathlib.Path, root: pathlib.Path | None = None) -> tuple[list[str], list[str]]:
    """(failures, report lines) for the checkout ``top`` and its results folder ``root``."""
    root = root or top / "results"
    fails, lines = [], []
    default = sets.default(root)
    lines.append(f"sets: {', '.join(f'{s} (complete)' if not sets.missing(s, root) else s for s in sets.slugs(root))}; "
                 f"the chapters read {default or 'no complete set'} by default")
    for (name, gpu), chapters in sorted(reads(top / "notebooks").items(), key=str):
        if gpu == EVERY_GPU:
            if name not in sets.EXTRA_MEASURES:
                fails.append(f"{', '.join(chapters)} read {name!r} from every GPU, but it is not in EXTRA_MEASURES")
                continue
            have = [f"results/{s}/{name}.json" for s in sets.slugs(root) if (root / s / f"{name}.json").is_file()]
            lines.append(f"{', '.join(chapters)} read {name!r} from every GPU that recorded it: "
                         f"{', '.join(have) or 'not recorded on a GPU yet'}")
            continue
        slug = results.gpu_slug(gpu) if gpu else default
        if gpu is None and name in sets.OPTIONAL:
            have = sets.optional_slug(name, root)
            lines.append(f"{', '.join(chapters)} read {name!r}: "
                         + (f"results/{have}/{name}.json" if have else "not recorded yet (the chapter measures live)"))
        elif gpu is None and name not in sets.SET:
            fails.append(f"{', '.join(chapters)} load {name!r} without naming a GPU, but it is not part of a set")
        elif slug is None:
            lacks = "; ".join(f"{s} lacks {', '.join(sets.missing(s, root))}" for s in sets.slugs(root))
            fails.append(f"{', '.join(chapters)} read {name!r} from the set, but no set is complete ({lacks})")
        elif not (root / slug / f"{name}.json").is_file():
            fails.append(f"{', '.join(chapters)} read results/{slug}/{name}.json, which is missing")
    for slug in ["cpu", *sets.slugs(root)]:
        for f in sorted((root / slug).glob("[!_]*.json")) if (root / slug).is_dir() else []:
            doc = json.loads(f.read_text())
            where = f"results/{slug}/{f.name}"
            for commit, _ in _commits(doc):
                if commit.endswith("+dirty"):
                    fails.append(f"{where} was recorded from uncommitted code ({commit})")
                    continue
                known = _git(top, "merge-base", "--is-ancestor", commit, "HEAD").returncode == 0
                if not known:
                    fails.append(f"{where} names commit {commit}, which is not in the history of HEAD")
            note = stale_note(doc) if doc.get("benchmark") else None
            lines.append(f"  {where:<44} {_commits(doc)[0][0][:12]} {_commits(doc)[0][1]}  "
                         f"{note or 'current'}")
    return fails, lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench evidence", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkout", default=".", help="the repository checkout (default: the current folder)")
    a = ap.parse_args(argv)
    top = pathlib.Path(_git(pathlib.Path(a.checkout), "rev-parse", "--show-toplevel").stdout.strip() or a.checkout)
    fails, lines = check(top)
    print("\n".join(lines))
    if fails:
        print("\nFAILED:\n" + "\n".join(f"  {f}" for f in fails))
        sys.exit(1)
    print("\nevidence: every recording a chapter reads is there, committed and in the history of HEAD")
