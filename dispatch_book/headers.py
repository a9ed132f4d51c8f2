"""The two header cells every chapter starts with, written by ``python -m dispatch_book.build sync``.

Cell 1: the title and the *Open in Colab* badge. Cell 2: the Colab install cell. The repository's
address lives in one place, ``[project.urls] Repository`` of pyproject.toml; the badge, the install
cell and the book's launch buttons (``repository.branch`` in _config.yml) all use the release tag
``v<version>``, so the notebook Colab opens matches the package it installs.

The install cell is light on purpose: Colab already has torch (with its triton), numpy,
matplotlib, tqdm and ipywidgets, and our ``torch>=2.11`` requirement must never make pip replace
Colab's CUDA build of torch. So the package goes in with ``--no-deps`` and then only the
dependencies Colab may lack or hold too old (transformers 5, tokenizers, safetensors), none of
which requires torch. Elsewhere the cell does nothing: ``make book`` installed everything.
"""
from __future__ import annotations

import copy
import pathlib
import re

from dispatch import files

# What Colab ships: never reinstalled by the install cell.
ON_COLAB = {"torch", "triton", "numpy", "matplotlib", "tqdm"}


def pyproject(root: pathlib.Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore
    return tomllib.loads((root / "pyproject.toml").read_text())


def repo_url(root: pathlib.Path) -> str:
    """The repository's public address: ``[project.urls] Repository`` in pyproject.toml, nowhere else."""
    return pyproject(root)["project"]["urls"]["Repository"].rstrip("/")


def pinned_ref(root: pathlib.Path) -> str:
    """The git ref Colab installs from: the release tag of this version."""
    return "v" + pyproject(root)["project"]["version"]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower()


def colab_deps(root: pathlib.Path) -> list[str]:
    """The package's dependencies that Colab does not ship (installed next to ``--no-deps``)."""
    return [d for d in pyproject(root)["project"]["dependencies"] if _name(d) not in ON_COLAB]


def badge_source(root: pathlib.Path, nb_path: pathlib.Path, title: str) -> str:
    slug = repo_url(root).removeprefix("https://github.com/")
    rel = nb_path.resolve().relative_to(root).as_posix()
    link = f"https://colab.research.google.com/github/{slug}/blob/{pinned_ref(root)}/{rel}"
    return f"# {title}\n\n[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({link})"


def install_source(root: pathlib.Path) -> str:
    deps = " ".join(f'"{d}"' for d in colab_deps(root))
    return ("# Colab only: install the package, keep Colab's torch (`make book` did it elsewhere).\n"
            "import sys\n\n"
            "if \"google.colab\" in sys.modules:\n"
            f"    PKG = \"git+{repo_url(root)}@{pinned_ref(root)}\"\n"
            "    !pip install -q --no-deps \"dispatch @ {PKG}\"\n"
            f"    !pip install -q {deps}")


def sync(root: pathlib.Path, paths=None, *, dry_run: bool = False) -> list[pathlib.Path]:
    """Rewrite the title/badge cell and the Colab install cell of each notebook; returns the changed
    files (``dry_run``: the files it would change, writing nothing)."""
    import nbformat

    changed = []
    cfg_path = root / "_config.yml"
    cfg = cfg_path.read_text()
    new_cfg = re.sub(r"(?m)^(repository:\n  url: ).*$", lambda m: m.group(1) + repo_url(root), cfg)
    # the launch buttons (Colab, Binder) open the chapters at the tag the install cell installs
    new_cfg = re.sub(r"(?m)^(repository:\n(?:  .*\n)*?  branch: ).*$", lambda m: m.group(1) + pinned_ref(root), new_cfg)
    if new_cfg != cfg:
        if not dry_run:
            files.write_text(cfg_path, new_cfg)
        changed.append(cfg_path)
    for p in paths or sorted((root / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(p, as_version=4)
        before = copy.deepcopy(nb)
        first = nb.cells[0] if nb.cells else None
        m = re.match(r"#\s+(.+)", first.source) if first is not None and first.cell_type == "markdown" else None
        if m is None:
            raise ValueError(f"{p.name}: the first cell must be a markdown cell starting with '# Title'")
        title = m.group(1).strip()
        rest = [ln for ln in first.source.splitlines()[1:] if not ln.startswith("[![Open In Colab]")]
        body = "\n".join(rest).strip()
        first.source = badge_source(root, p, title) + ("\n\n" + body if body else "")
        if len(nb.cells) < 2 or nb.cells[1].cell_type != "code" or "colab" not in nb.cells[1].source.lower():
            raise ValueError(f"{p.name}: the second cell must be the Colab install cell (a code cell with 'colab')")
        nb.cells[1].source = install_source(root)
        # Colab-only plumbing: hidden in the web book, where it would stand before the first sentence
        tags = nb.cells[1].metadata.setdefault("tags", [])
        if "remove-cell" not in tags:
            tags.append("remove-cell")
        nb.metadata["accelerator"] = "GPU"
        nb.metadata.setdefault("colab", {})["gpuType"] = "T4"
        nb.metadata.setdefault("colab", {})["provenance"] = []
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        if nb != before:
            if not dry_run:
                with files.replacing(p) as tmp:
                    nbformat.write(nb, tmp)
            changed.append(p)
    return changed
