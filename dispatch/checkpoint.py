"""Checkpoint folders written whole or not at all, verified when read, never written over a stranger.

``swap(new, dest)`` puts a fully written folder in place (the old one is moved aside first and
removed last); ``write_hashes`` records the SHA-256 of every file in ``hashes.json`` (which also
marks the folder as one the package wrote) and ``verify`` checks a folder against it.
``check_replaceable(dest, force)`` refuses, before any work, a destination that holds something
else: a file, or a non-empty folder without our ``hashes.json``. ``resolve`` tells a local folder
from a hub id, at once (no minute of network retries for a mistyped path).
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import tempfile
import warnings

HASH_FILE = "hashes.json"
FORMAT = "dispatch.checkpoint/1"


class UnverifiedWarning(UserWarning):
    """Weights were read from a file or folder that carries no content hash: nothing was verified."""


def swap(new: pathlib.Path, dest: pathlib.Path) -> None:
    """Put folder ``new`` at ``dest``: the old folder is moved aside first and removed last."""
    old = None
    if dest.exists() or dest.is_symlink():
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
    (folder / HASH_FILE).write_text(json.dumps({"format": FORMAT, "sha256": hashes}, indent=1) + "\n")
    return hashes


def read_hashes(folder: pathlib.Path) -> dict[str, str]:
    """{file name: SHA-256} from a folder's ``hashes.json``; ValueError naming the file if it is not
    one the package wrote (not JSON, or no "sha256" table of names to hex digests)."""
    path = pathlib.Path(folder) / HASH_FILE
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); a checkpoint's {HASH_FILE} is "
                         '{"sha256": {file name: hex digest}}: the folder cannot be verified') from None
    want = doc.get("sha256") if isinstance(doc, dict) else None
    if not isinstance(want, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in want.items()):
        raise ValueError(f"{path} has no \"sha256\" table of file names to hex digests: the folder cannot be "
                         "verified")
    return want


def is_checkpoint(folder: pathlib.Path) -> bool:
    """True if ``folder`` carries a ``hashes.json`` the package wrote (the marker of our checkpoints)."""
    try:
        read_hashes(folder)
    except (OSError, ValueError):
        return False
    return True


def check_replaceable(dest: pathlib.Path, force: bool = False) -> None:
    """FileExistsError unless writing a checkpoint at ``dest`` destroys nothing the package did not
    write: ``dest`` is absent, an empty folder, or a checkpoint folder (with our ``hashes.json``).
    ``force``: replace whatever is there."""
    dest = pathlib.Path(dest)
    if force or not (dest.exists() or dest.is_symlink()):
        return
    if not dest.is_dir():
        raise FileExistsError(f"{dest} is a file, not a checkpoint folder: refusing to replace it "
                              "(choose another path, or pass --force / force=True to replace it)")
    if is_checkpoint(dest):
        return
    entries = sorted(p.name for p in dest.iterdir())
    if entries:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        raise FileExistsError(f"{dest} is a folder that is not a checkpoint written by dispatch (no valid "
                              f"{HASH_FILE}); it holds {shown}: refusing to replace it (choose another path, "
                              "or pass --force / force=True to replace it)")


def verify(folder: pathlib.Path, strict: bool = False) -> bool:
    """Check a checkpoint folder against its ``hashes.json``; ValueError naming the first bad file.
    A folder without one (not written by the package, or older) is loaded unverified with an
    :class:`UnverifiedWarning`, or refused (ValueError) with ``strict``. Returns whether it was verified."""
    folder = pathlib.Path(folder)
    if not (folder / HASH_FILE).exists():
        msg = f"{folder} has no {HASH_FILE}: its weights cannot be verified (a corrupted file would load)"
        if strict:
            raise ValueError(msg + "; strict=True refuses it")
        warnings.warn(msg, UnverifiedWarning, stacklevel=3)
        return False
    want = read_hashes(folder)
    unlisted = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in want)
    if unlisted:
        raise ValueError(f"checkpoint {folder}: {', '.join(unlisted)} not listed in {HASH_FILE} (added after saving?)")
    for name, digest in want.items():
        p = folder / name
        if not p.is_file():
            raise ValueError(f"checkpoint {folder}: {name} is missing (listed in {HASH_FILE})")
        if _sha256(p) != digest:
            raise ValueError(f"checkpoint {folder}: {name} does not match its SHA-256 in {HASH_FILE} "
                             "(corrupted or changed after saving)")
    return True


def resolve(source, assets: pathlib.Path, presets) -> tuple[str, bool]:
    """Where :func:`dispatch.train.load` reads ``source`` from: ``(what to load, read only local files)``.
    ``assets``: the folder of committed checkpoints (by preset name), ``presets``: the preset names.
    FileNotFoundError at once for a local path that does
    not exist (a hub id is exactly ``owner/name``; paths and Path objects are never sent to the hub,
    nor is ``a/b`` when the folder ``a`` exists here), and for a hub id the hub does not have or
    cannot be asked for (unless it is in the local cache): no minute of retries."""
    if isinstance(source, str) and (assets / source).is_dir():
        return str(assets / source), True
    if isinstance(source, str) and source in presets:
        raise FileNotFoundError(f"preset {source!r} has no committed checkpoint; train one with "
                                f"`python -m dispatch.train --preset {source} --out DIR` and load DIR")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a preset name, a folder or a hub id, got {type(source).__name__}")
    path = pathlib.Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a checkpoint folder (expected config.json, "
                                    "model.safetensors and the tokenizer files, as dispatch.train writes them)")
        return str(path), True
    text = str(source)
    hub_like = not isinstance(source, os.PathLike) and text.count("/") == 1 and not text.startswith((".", "~", "/"))
    if not hub_like or pathlib.Path(text.split("/")[0]).is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path} (a local path; hub ids look like owner/name)")
    return text, _hub_check(text)


def _hub_check(repo: str) -> bool:
    """Whether to read ``repo`` from the local cache only: True when the hub cannot be reached but the
    cache holds it; FileNotFoundError when the hub has no such model, or is out of reach and the
    cache does not hold it."""
    from huggingface_hub import HfApi, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError

    cached = isinstance(try_to_load_from_cache(repo, "config.json"), str)
    try:
        HfApi().model_info(repo, timeout=10)
    except RepositoryNotFoundError:
        raise FileNotFoundError(f"no checkpoint folder at {repo}, and the Hugging Face hub has no model {repo!r} "
                                "(or it is private)") from None
    except Exception as e:  # noqa: BLE001 - offline, DNS, proxy, timeout: the hub is out of reach
        if cached:
            return True
        raise FileNotFoundError(f"no checkpoint folder at {repo}; as a hub id it is not in the local cache and the "
                                f"hub cannot be reached ({type(e).__name__}: {e})") from None
    return False
