"""Files written whole or not at all: every file the package writes goes through here.

``replacing(path)`` yields a temporary path in the same folder; when the block succeeds the file is
flushed to disk and renamed over ``path`` (one atomic step on one filesystem), when it fails the
temporary file is removed. A write cut short (disk full, an exception, Ctrl-C) therefore leaves
``path`` as it was: never truncated, never half written. ``check_writable`` tells, before hours of
work, whether a file can be written there at all.

    with files.replacing(path) as tmp:       # any writer that takes a path
        save_file(tensors, str(tmp))
    files.write_text(path, json.dumps(doc))  # the common case
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import secrets
from typing import Iterator


def _temp_beside(path: pathlib.Path) -> pathlib.Path:
    """A new empty file next to ``path`` (mode 0o666 less the umask, as a plain open would give)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


@contextlib.contextmanager
def replacing(path) -> Iterator[pathlib.Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` whole, on failure it
    is removed and ``path`` is untouched. The folder is created if needed."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected the path of a file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        yield tmp
        with open(tmp, "rb+") as f:  # on disk before the rename: a crash cannot leave an empty file
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> pathlib.Path:
    """Write ``text`` (UTF-8) to ``path`` whole or not at all."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return pathlib.Path(path)


def write_bytes(path, data: bytes) -> pathlib.Path:
    """Write ``data`` to ``path`` whole or not at all."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)
    return pathlib.Path(path)


def check_writable(path) -> None:
    """OSError naming ``path`` and the reason unless a file can be written there (its folder is
    created if missing; an existing file is left alone). For long jobs: ask before the work."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder; expected the path of a file to write")
    above = next((p for p in path.parents if p.exists()), None)
    if above is not None and not above.is_dir():
        raise NotADirectoryError(f"cannot write {path}: {above} is a file, not a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _temp_beside(path).unlink()
    except OSError as e:
        raise OSError(f"cannot write {path}: {e.strerror or e}") from None
