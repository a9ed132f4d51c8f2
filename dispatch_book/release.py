"""A release: the git tag the chapters' Colab cells install, ``python -m dispatch_book.release`` (make release).

Every chapter's header cells name one ref (``headers.pinned_ref``: ``v<version>`` of pyproject.toml):
the Colab badge opens the chapter at that ref, the install cell installs the package from it, and
the book's launch buttons use it. A tag is a name that the tagged commit can carry itself, so a
chapter opened at ``v0.1.0`` installs exactly the package beside it.

The command tags the current commit ``v<version>`` (annotated), after checking that

* the working tree is clean (a tag names a commit, not the files on disk);
* the header cells already name that ref (``python -m dispatch_book.build sync`` writes them; if it
  would change a file, the tree is not what is being released);
* the tag is new, or already names this commit (then there is nothing to do).

Then it writes the tag and its commit into ``releases.json`` (commit that file: a clone made without
tags, as CI makes one, still knows which commit a release names) and prints the command that
publishes the tag: a tag lives in this clone until it is pushed. To release a new version: raise
``version`` in pyproject.toml, run sync, commit, ``make release``, commit releases.json, and push the
commits and the tag together (``tests/test_release.py`` checks, in every clone with history, that the
ref the chapters name is a tag or a recorded release, and a commit of the checked-out history).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

from dispatch_book import headers


def git(root: pathlib.Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise SystemExit(f"git {' '.join(args)} failed: {(res.stderr or res.stdout).strip()}")
    return res


def commit_of(root: pathlib.Path, ref: str) -> str | None:
    """The commit ``ref`` (a tag, a branch or a commit id) names in this clone, or None."""
    res = git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    return res.stdout.strip() or None


RECORD = "releases.json"


def recorded(root: pathlib.Path) -> dict[str, str]:
    """Tag → full commit id of every release made here (``releases.json``; empty when there is none)."""
    path = root / RECORD
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not all(isinstance(v, str) and len(v) == 40 for v in data.values()):
        raise SystemExit(f"{path}: expected an object of tag → 40-hex commit id, got {data!r}")
    return data


def release_commit(root: pathlib.Path, ref: str) -> str | None:
    """The commit the release ``ref`` names: its tag in this clone, else its record in releases.json.
    A tag and a record that disagree are an error."""
    tagged, written = commit_of(root, f"refs/tags/{ref}"), recorded(root).get(ref)
    if tagged and written and tagged != written:
        raise SystemExit(f"{ref}: the tag names {tagged[:12]}, {RECORD} says {written[:12]}")
    return tagged or written


def is_shallow(root: pathlib.Path) -> bool:
    return git(root, "rev-parse", "--is-shallow-repository", check=False).stdout.strip() == "true"


def release(root: pathlib.Path, *, dry_run: bool = False) -> str:
    """Tag HEAD with the chapters' ref; returns the tag. Raises SystemExit saying what is wrong."""
    tag = headers.pinned_ref(root)
    if git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip():
        raise SystemExit(f"release {tag}: the working tree has uncommitted changes; commit them first")
    stale = headers.sync(root, dry_run=True)
    if stale:
        names = ", ".join(p.relative_to(root).as_posix() for p in stale)
        raise SystemExit(f"release {tag}: the header cells do not name {tag} yet ({names}): run "
                         "`python -m dispatch_book.build sync` and commit")
    head = commit_of(root, "HEAD")
    tagged = commit_of(root, f"refs/tags/{tag}")
    if tagged == head:
        print(f"{tag} already names this commit ({head[:12]})")
        _record(root, tag, head, dry_run)
        return tag
    if tagged is not None:
        raise SystemExit(f"release {tag}: the tag exists and names {tagged[:12]}, not this commit "
                         f"{head[:12]}: raise the version in pyproject.toml for a new release")
    if not dry_run:
        git(root, "tag", "-a", tag, "-m", f"dispatch {tag.removeprefix('v')}")
    print(f"{'would tag' if dry_run else 'tagged'} {head[:12]} as {tag}; publish it with: git push origin {tag}")
    _record(root, tag, head, dry_run)
    return tag


def _record(root: pathlib.Path, tag: str, head: str, dry_run: bool) -> None:
    have = recorded(root)
    if have.get(tag) == head or dry_run:
        return
    if tag in have:
        raise SystemExit(f"release {tag}: {RECORD} already records it at {have[tag][:12]}, not {head[:12]}")
    (root / RECORD).write_text(json.dumps({**have, tag: head}, indent=1, sort_keys=True) + "\n")
    print(f"recorded {tag} in {RECORD}: commit it (`git commit {RECORD} -m 'release {tag}'`)")


def main(argv=None) -> None:
    from dispatch_book.build import find_root

    ap = argparse.ArgumentParser(prog="python -m dispatch_book.release", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", help="the repository checkout (default: the one around the current directory)")
    ap.add_argument("--dry-run", action="store_true", help="check everything, create no tag")
    args = ap.parse_args(argv)
    release(find_root(pathlib.Path(args.root) if args.root else None), dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
