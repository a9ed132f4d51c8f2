"""The notebook-to-book pipeline: ``python -m dispatch_book.build`` (what ``make book`` runs).

    python -m dispatch_book.build                 execute every chapter in _toc.yml, then build the book
    python -m dispatch_book.build -p preset X     ... overriding a parameter (in the chapters that have it)
    python -m dispatch_book.build run NB [-p k v] refresh one notebook's committed outputs
    python -m dispatch_book.build sync            rewrite every chapter's header cells from pyproject.toml
    python -m dispatch_book.build --gpu [--t4-budget] [--out DIR]
                                                  every chapter on this GPU with its "auto" parameters,
                                                  timed → DIR/<gpu>/book_gpu.json (make book-gpu)
    python -m dispatch_book.build gpu NB [NB ...] [--t4-budget] [--out DIR]   ... only these chapters

The builder works on a checkout of the repository: the one around the current directory, or
``--root DIR``. Chapters are executed with papermill into a staging copy of the book
(``_build/src``), so a run on a GPU, or with other parameters, never dirties the committed
notebooks; jupyter-book then builds ``_build/html`` from the staging copy with warnings as errors.
``run`` executes into ``_build/run`` and replaces the committed notebook only when every cell
succeeded. A ``-p`` name no chapter declares (with ``run``: that the notebook does not declare)
is an error naming the declared ones. A failing cell stops the run and names the notebook and cell.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys

from dispatch_book import execute, headers, vendor

_root: pathlib.Path | None = None


def find_root(start: pathlib.Path | None = None) -> pathlib.Path:
    """The checkout around ``start`` (default: the current directory): the folder with _toc.yml."""
    here = pathlib.Path(start or pathlib.Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "_toc.yml").is_file() and (d / "pyproject.toml").is_file():
            return d
    raise SystemExit(f"no checkout of the book around {here} (no _toc.yml): run from the repository or pass --root")


def root() -> pathlib.Path:
    global _root
    if _root is None:
        _root = find_root()
    return _root


def set_root(path: pathlib.Path | str) -> pathlib.Path:
    global _root
    _root = find_root(pathlib.Path(path))
    return _root


def build_dir() -> pathlib.Path:
    return root() / "_build"


def chapters() -> list[pathlib.Path]:
    """Notebooks in _toc.yml order."""
    import yaml

    files: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(yaml.safe_load((root() / "_toc.yml").read_text()))
    return [root() / f"{f}.ipynb" for f in files if (root() / f"{f}.ipynb").exists()]


# The header cells, for this checkout.
def repo_url() -> str:
    return headers.repo_url(root())


def badge_source(nb_path: pathlib.Path, title: str) -> str:
    return headers.badge_source(root(), nb_path, title)


def install_source() -> str:
    return headers.install_source(root())


def sync(paths=None) -> list[pathlib.Path]:
    return headers.sync(root(), paths)


def stage() -> pathlib.Path:
    """Copy the book's sources into _build/src (notebooks are executed into it)."""
    src = build_dir() / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml", "README.md"):
        shutil.copy(root() / name, src / name)
    vendor.fetch(root() / "book" / "_static" / "vendor")  # MathJax and the widget library, pinned
    shutil.copytree(root() / "book", src / "book")
    (src / "notebooks").mkdir()
    return src


def build_book(src: pathlib.Path) -> pathlib.Path:
    """Build the HTML book from ``src`` straight into _build/html (jupyter-book writes to
    ``<path-output>/_build/html``), so the path it prints is the one the book is at."""
    html = build_dir() / "html"
    if html.exists():
        shutil.rmtree(html)  # no page of an earlier build left behind
    # jupyter-book 1.x has no `python -m jupyter_book`; call its CLI entry point with this Python.
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())", "build",
           str(src), "--path-output", str(root()), "-W", "--keep-going", "--all"]
    res = subprocess.run(cmd)
    if res.returncode != 0:
        raise SystemExit(f"jupyter-book build failed (exit {res.returncode}); command: {' '.join(cmd)}")
    return html / "index.html"


def check_overrides(nbs: list[pathlib.Path], overrides: dict) -> None:
    """A book-wide ``-p`` name must be declared by at least one chapter."""
    known = {}
    for nb in nbs:
        known.update(execute.declared(nb))
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise SystemExit(f"no chapter has a parameter {', '.join(map(repr, unknown))}; "
                         f"the chapters' parameters are: {', '.join(sorted(known))}")


def _parse_value(v: str):
    import yaml

    return yaml.safe_load(v)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="all", choices=["all", "run", "sync", "build", "gpu"])
    ap.add_argument("notebooks", nargs="*", help="with 'run': the notebooks to execute; with --gpu: only these")
    ap.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="override a parameter (YAML value): in every chapter that declares it")
    ap.add_argument("--root", help="the repository checkout (default: the one around the current directory)")
    ap.add_argument("--no-build", action="store_true", help="execute only; skip jupyter-book")
    ap.add_argument("--gpu", action="store_true", help="execute every chapter on this GPU; record book_gpu.json")
    ap.add_argument("--t4-budget", action="store_true", help="with --gpu: fp16, 15 GB, 64 KiB shared memory")
    ap.add_argument("--out", default=None, metavar="DIR",
                    help="with --gpu: results root (default _build/results; `--out results` records for the book)")
    ap.add_argument("--allow-dirty", action="store_true", help="with --gpu: record a run of uncommitted code")
    ap.add_argument("--cell-timeout", type=float, default=execute.CELL_TIMEOUT_S, metavar="SECONDS",
                    help=f"'run' and 'all': seconds a cell may run before it counts as hung (default "
                         f"{execute.CELL_TIMEOUT_S:g}; 0: no limit)")
    return ap


def main(argv=None) -> None:
    ap = parser()
    args = ap.parse_args(argv)
    if args.cell_timeout < 0:
        ap.error(f"--cell-timeout must be >= 0 seconds, got {args.cell_timeout:g}")
    cell_timeout = args.cell_timeout or None
    if args.root:
        set_root(args.root)
    overrides = {k: _parse_value(v) for k, v in args.param}

    if args.command == "sync":
        for p in sync():
            print("synced", p.relative_to(root()))
        return
    if args.command == "run":
        if not args.notebooks:
            raise SystemExit("run: name the notebooks to execute")
        for nb in args.notebooks:
            try:
                execute.check_notebook(pathlib.Path(nb))
            except (OSError, ValueError) as e:
                raise SystemExit(f"run: {e}") from None
        for nb in args.notebooks:
            p = pathlib.Path(nb).resolve()
            print(f"executing {execute._rel(p, root())} ...", flush=True)
            try:
                secs = execute.run_in_place(p, overrides, build_dir() / "run", root(), cell_timeout=cell_timeout)
            except ValueError as e:
                raise SystemExit(str(e)) from None
            print(f"  done in {secs:.0f} s; outputs refreshed")
        return
    if args.gpu or args.command == "gpu":
        from dispatch_book import gpu_book

        if overrides:
            raise SystemExit("--gpu runs the chapters with their \"auto\" parameters: no -p")
        chosen = [pathlib.Path(n).resolve() for n in args.notebooks] or chapters()
        path = gpu_book.run(chosen, build_dir(), t4_budget=args.t4_budget, out=args.out,
                            allow_dirty=args.allow_dirty)
        print(f"wrote {path}")
        return

    from tqdm import tqdm

    nbs = chapters()
    if args.command == "all":
        check_overrides(nbs, overrides)  # before anything is written
    sync()
    src = stage()
    if args.command == "all":
        bar = tqdm(nbs, desc="chapters", unit="nb", file=sys.stdout)
        for nb in bar:
            bar.set_postfix_str(nb.name)
            secs = execute.execute(nb, src / "notebooks" / nb.name, overrides, strict=False, root=root(),
                                   cell_timeout=cell_timeout)
            tqdm.write(f"  {execute._rel(nb, root())}: {secs:.0f} s")
    else:  # build from the committed outputs
        for nb in nbs:
            shutil.copy(nb, src / "notebooks" / nb.name)
    if args.no_build:
        return
    index = build_book(src)
    print(f"\nThe book is built: {index.relative_to(root())}")


if __name__ == "__main__":
    main()
