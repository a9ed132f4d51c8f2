"""The notebook-to-book pipeline: ``python -m dispatch_book.build`` (what ``make book`` runs).

    python -m dispatch_book.build                 execute every chapter in _toc.yml, then build the book
    python -m dispatch_book.build -p preset X     ... overriding a parameter (only where a chapter has it)
    python -m dispatch_book.build run NB [-p k v] execute one notebook in place (to refresh its outputs)
    python -m dispatch_book.build sync            rewrite every chapter's header cells from pyproject.toml

Chapters are executed with papermill into a staging copy of the book (``_build/src``), so a run on
a GPU, or with other parameters, never dirties the committed notebooks; jupyter-book then builds
``_build/html`` from the staging copy with warnings as errors. A failing cell stops the run and
names the notebook and the cell. ``--inplace`` executes the committed notebooks themselves (how
their committed outputs are refreshed).
"""
from __future__ import annotations

import argparse
import copy
import pathlib
import re
import shutil
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "_build"


def _pyproject() -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def repo_url() -> str:
    """The repository's public address: ``[project.urls] Repository`` in pyproject.toml, nowhere else."""
    return _pyproject()["project"]["urls"]["Repository"].rstrip("/")


def pinned_ref() -> str:
    """The git ref Colab installs from: the release tag of this version."""
    return "v" + _pyproject()["project"]["version"]


def chapters() -> list[pathlib.Path]:
    """Notebooks in _toc.yml order."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
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

    walk(toc)
    return [ROOT / f"{f}.ipynb" for f in files if (ROOT / f"{f}.ipynb").exists()]


# ---- the two header cells every chapter starts with -------------------------------------------
def badge_source(nb_path: pathlib.Path, title: str) -> str:
    slug = repo_url().removeprefix("https://github.com/")
    rel = nb_path.resolve().relative_to(ROOT).as_posix()
    link = f"https://colab.research.google.com/github/{slug}/blob/main/{rel}"
    return (f"# {title}\n\n[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})")


def install_source() -> str:
    spec = f"dispatch[book] @ git+{repo_url()}@{pinned_ref()}"
    return ("# Colab only: install the package at its pinned release (elsewhere `make book` did it).\n"
            "import sys\n"
            "if \"google.colab\" in sys.modules:\n"
            f"    !pip install -q \"{spec}\" \"transformers>=5.17,<6\" \"triton>=3.6\"")


def sync(paths=None) -> list[pathlib.Path]:
    """Rewrite the title/badge cell and the Colab install cell of each notebook; returns the changed."""
    import nbformat

    changed = []
    cfg_path = ROOT / "_config.yml"
    cfg = cfg_path.read_text()
    new_cfg = re.sub(r"(?m)^(repository:\n  url: ).*$", lambda m: m.group(1) + repo_url(), cfg)
    if new_cfg != cfg:
        cfg_path.write_text(new_cfg)
        changed.append(cfg_path)
    for p in paths or sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(p, as_version=4)
        before = copy.deepcopy(nb)
        first = nb.cells[0] if nb.cells else None
        m = re.match(r"#\s+(.+)", first.source) if first is not None and first.cell_type == "markdown" else None
        if m is None:
            raise ValueError(f"{p.name}: the first cell must be a markdown cell starting with '# Title'")
        title = m.group(1).strip()
        rest = [ln for ln in first.source.splitlines()[1:] if not ln.startswith("[![Open In Colab]")]
        body = "\n".join(rest).strip()
        first.source = badge_source(p, title) + ("\n\n" + body if body else "")
        if len(nb.cells) < 2 or nb.cells[1].cell_type != "code" or "colab" not in nb.cells[1].source.lower():
            raise ValueError(f"{p.name}: the second cell must be the Colab install cell (a code cell with 'colab')")
        nb.cells[1].source = install_source()
        nb.cells[1].metadata.setdefault("tags", [])
        nb.metadata["accelerator"] = "GPU"
        nb.metadata.setdefault("colab", {})["gpuType"] = "T4"
        nb.metadata.setdefault("colab", {})["provenance"] = []
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        if nb != before:
            nbformat.write(nb, p)
            changed.append(p)
    return changed


# ---- execution -----------------------------------------------------------------------------
def _params_for(nb_path: pathlib.Path, overrides: dict) -> dict:
    """Only the overrides this notebook declares in its parameters cell."""
    import papermill

    declared = papermill.inspect_notebook(str(nb_path))
    return {k: v for k, v in overrides.items() if k in declared}


def execute(nb_path: pathlib.Path, out_path: pathlib.Path, overrides: dict | None = None) -> float:
    """Execute one notebook with papermill (cwd = notebooks/); raises SystemExit naming the cell."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    params = _params_for(nb_path, overrides or {})
    t0 = time.time()
    try:
        papermill.execute_notebook(str(nb_path), str(out_path), parameters=params, kernel_name="python3",
                                   cwd=str(nb_path.parent), progress_bar=False)
    except PapermillExecutionError as e:
        raise SystemExit(f"\n{_rel(nb_path)}: cell {e.exec_count} failed: {e.ename}: {e.evalue}\n"
                         f"(executed copy with the traceback: {out_path})") from None
    _relative_paths(out_path)
    return time.time() - t0


def _rel(p: pathlib.Path) -> str:
    """``p`` relative to the repository when it is inside it (for messages)."""
    p = pathlib.Path(p).resolve()
    return p.relative_to(ROOT).as_posix() if ROOT in p.parents else str(p)


def _relative_paths(nb_path: pathlib.Path) -> None:
    """papermill records absolute input/output paths: keep committed notebooks machine-independent."""
    import nbformat

    nb = nbformat.read(nb_path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    for key in ("input_path", "output_path"):
        if pm.get(key):
            p = pathlib.Path(pm[key])
            pm[key] = p.relative_to(ROOT).as_posix() if p.is_absolute() and ROOT in p.parents else p.name
    nbformat.write(nb, nb_path)


def _parse_value(v: str):
    import yaml

    return yaml.safe_load(v)


def stage() -> pathlib.Path:
    """Copy the book's sources into _build/src (notebooks are executed into it)."""
    src = BUILD / "src"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "book", src / "book")
    (src / "notebooks").mkdir()
    return src


def build_book(src: pathlib.Path) -> pathlib.Path:
    # jupyter-book 1.x has no `python -m jupyter_book`; call its CLI entry point with this Python.
    cmd = [sys.executable, "-c", "import sys; from jupyter_book.cli.main import main; sys.exit(main())", "build", str(src), "--path-output", str(BUILD / "book"),
           "-W", "--keep-going", "--all"]
    res = subprocess.run(cmd)
    if res.returncode != 0:
        raise SystemExit(f"jupyter-book build failed (exit {res.returncode}); command: {' '.join(cmd)}")
    html = BUILD / "html"
    if html.exists():
        shutil.rmtree(html)
    shutil.copytree(BUILD / "book" / "_build" / "html", html)
    return html / "index.html"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", nargs="?", default="all", choices=["all", "run", "sync", "build"])
    ap.add_argument("notebooks", nargs="*", help="with 'run': the notebooks to execute in place")
    ap.add_argument("-p", "--param", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="override a parameter in every chapter that declares it (YAML value)")
    ap.add_argument("--inplace", action="store_true", help="execute the committed notebooks in place")
    ap.add_argument("--no-build", action="store_true", help="execute only; skip jupyter-book")
    args = ap.parse_args(argv)
    overrides = {k: _parse_value(v) for k, v in args.param}

    if args.command == "sync":
        for p in sync():
            print("synced", p.relative_to(ROOT))
        return
    if args.command == "run":
        for nb in args.notebooks:
            p = pathlib.Path(nb).resolve()
            print(f"executing {_rel(p)} in place ...", flush=True)
            print(f"  done in {execute(p, p, overrides):.0f} s")
        return

    from tqdm import tqdm

    sync()
    src = stage()
    nbs = chapters()
    if args.command == "all":
        bar = tqdm(nbs, desc="chapters", unit="nb", file=sys.stdout)
        for nb in bar:
            bar.set_postfix_str(nb.name)
            out = nb if args.inplace else src / "notebooks" / nb.name
            secs = execute(nb, out, overrides)
            tqdm.write(f"  {_rel(nb)}: {secs:.0f} s")
            if args.inplace:
                shutil.copy(nb, src / "notebooks" / nb.name)
    else:  # build from the committed outputs
        for nb in nbs:
            shutil.copy(nb, src / "notebooks" / nb.name)
    if args.no_build:
        return
    index = build_book(src)
    print(f"\nThe book is built: {index}")


if __name__ == "__main__":
    main()
