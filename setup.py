"""Package layout (everything else is in pyproject.toml).

``dispatch`` (the library) and ``dispatch_book`` (the book's tooling) are found as usual. The
repository's ``results/`` folder — the recorded GPU measurements the chapters plot — is mapped to
the package ``dispatch_book.results``, so it ships in the wheel and is read with
``importlib.resources`` from a checkout, an editable install and a wheel alike.

Data folders (``dispatch/assets/<model>``, ``dispatch_book/bench/data``, ``results/<gpu>``) are
listed as packages too: Python can import a folder whose name is an identifier, and setuptools
warns about each one it is not told about. Their files are the package data declared in pyproject.toml.

A build writes its scratch files (``build/``, ``*.egg-info``) to a temporary folder, removed when
it ends, so ``pip install .`` leaves the checkout as it was.
"""
import atexit
import pathlib
import shutil
import tempfile

from setuptools import find_packages, setup

HERE = pathlib.Path(__file__).resolve().parent


def data_packages(package: str, folder: str) -> list[str]:
    """Every folder under ``folder`` that Python could import, as a subpackage of ``package``."""
    root = HERE / folder
    return [".".join((package, *d.relative_to(root).parts)) for d in sorted(root.rglob("*"))
            if d.is_dir() and all(part.isidentifier() for part in d.relative_to(root).parts)]


scratch = tempfile.mkdtemp(prefix="dispatch-build-")
atexit.register(shutil.rmtree, scratch, ignore_errors=True)

setup(
    packages=find_packages(include=["dispatch", "dispatch.*", "dispatch_book", "dispatch_book.*"])
    + data_packages("dispatch.assets", "dispatch/assets") + ["dispatch_book.bench.data", "dispatch_book.results"]
    + data_packages("dispatch_book.results", "results"),
    package_dir={"dispatch_book.results": "results"},
    options={"build": {"build_base": f"{scratch}/build"}, "egg_info": {"egg_base": scratch}},
)
