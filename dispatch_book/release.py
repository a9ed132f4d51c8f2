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

Then it prints the command that publishes it: a tag lives in this clone until it is pushed. To
release a new version: raise ``version`` in pyproject.toml, run sync, commit, ``make release``, and
push the commit and the tag together (``tests/test_book.py`` checks, in every clone with history,
that the ref the chapters name exists and is a commit of the checked-out history).
"""
from __future__ import annotations

import argparse
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
        return tag
    if tagged is not None:
        raise SystemExit(f"release {tag}: the tag exists and names {tagged[:12]}, not this commit "
                         f"{head[:12]}: raise the version in pyproject.toml for a new release")
    if not dry_run:
        git(root, "tag", "-a", tag, "-m", f"dispatch {tag.removeprefix('v')}")
    print(f"{'would tag' if dry_run else 'tagged'} {head[:12]} as {tag}; publish it with: git push origin {tag}")
    return tag


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
