"""Package layout (everything else is in pyproject.toml).

``dispatch`` (the library) and ``dispatch_book`` (the book's tooling) are found as usual. The
repository's ``results/`` folder — the recorded GPU measurements the chapters plot — is mapped to
the package ``dispatch_book.results``, so it ships in the wheel and is read with
``importlib.resources`` from a checkout, an editable install and a wheel alike.
"""
from setuptools import find_packages, setup

setup(
    packages=find_packages(include=["dispatch", "dispatch.*", "dispatch_book", "dispatch_book.*"])
    + ["dispatch_book.results"],
    package_dir={"dispatch_book.results": "results"},
)
