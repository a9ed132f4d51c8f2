"""Checkpoint folders written whole or not at all, and verified when read.

``swap(new, dest)`` puts a fully written folder in place (the old one is moved aside first and
removed last); ``write_hashes`` records the SHA-256 of every file in ``hashes.json`` and ``verify``
checks a folder against it.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile

HASH_FILE = "hashes.json"


def swap(new: pathlib.Path, dest: pathlib.Path) -> None:
    """Put folder ``new`` at ``dest``: the old folder is moved aside first and removed last."""
    old = None
    if dest.exists():
        old = pathlib.Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.old-"))
        os.replace(dest, old / dest.name)
    try:
        os.replace(new, dest)
    except BaseException:
        if old is not None:
            os.replace(old / dest.name, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha256(path: pathlib.Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_hashes(folder: pathlib.Path) -> dict:
    """Write ``hashes.json``: the SHA-256 of every other file of a checkpoint folder."""
    folder = pathlib.Path(folder)
    hashes = {p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != HASH_FILE}
    (folder / HASH_FILE).write_text(json.dumps({"sha256": hashes}, indent=1) + "\n")
    return hashes


def verify(folder: pathlib.Path) -> None:
    """Check a checkpoint folder against its ``hashes.json``; ValueError naming the first bad file."""
    folder = pathlib.Path(folder)
    want = json.loads((folder / HASH_FILE).read_text())["sha256"]
    for name, digest in want.items():
        p = folder / name
        if not p.is_file():
            raise ValueError(f"checkpoint {folder}: {name} is missing (listed in {HASH_FILE})")
        if _sha256(p) != digest:
            raise ValueError(f"checkpoint {folder}: {name} does not match its SHA-256 in {HASH_FILE} "
                             "(corrupted or changed after saving)")
