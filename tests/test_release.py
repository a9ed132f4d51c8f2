"""The ref the chapters install exists, and `make release` creates it (dispatch_book/release.py)."""
import json
import pathlib
import re
import shutil
import subprocess

import nbformat
import pytest
import yaml

from dispatch_book import build as book
from dispatch_book import headers, release

ROOT = book.set_root(pathlib.Path(__file__).resolve().parents[1])


def named_refs() -> set[str]:
    """Every ref the book names: install cells, Colab badges, the launch buttons' branch."""
    refs = {yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"]}
    for nb in book.chapters():
        cells = json.loads(nb.read_text())["cells"]
        refs |= set(re.findall(r"/blob/([^/\s]+)/notebooks/", "".join(cells[0]["source"])))
        refs |= set(re.findall(r"@([^\s\"]+)\"", "".join(cells[1]["source"])))
    return refs


def test_the_chapters_install_a_ref_of_this_repository():
    assert named_refs() == {headers.pinned_ref(ROOT)}, "run `python -m dispatch_book.build sync`"
    if release.git(ROOT, "rev-parse", "--git-dir", check=False).returncode != 0:
        pytest.skip("not a git checkout (a copied tree): no refs to look up")
    ref = headers.pinned_ref(ROOT)
    commit = release.release_commit(ROOT, ref)
    if commit is None and release.is_shallow(ROOT):
        pytest.fail(f"{ref} is not in this shallow clone: clone with history and tags "
                    "(actions/checkout: fetch-depth: 0; here: git fetch --unshallow --tags)")
    assert commit is not None, (f"the chapters install {ref}, which this repository neither tags nor records in "
                                f"{release.RECORD}: `make release`")
    ancestor = release.git(ROOT, "merge-base", "--is-ancestor", commit, "HEAD", check=False)
    assert ancestor.returncode == 0, f"{ref} ({commit[:12]}) is not a commit of the checked-out history"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A small checkout: pyproject.toml, _config.yml and one chapter with its header cells, committed."""
    for var, value in {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
                       "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": "/dev/null"}.items():
        monkeypatch.setenv(var, value)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(ROOT / "_config.yml", tmp_path)
    (tmp_path / "notebooks").mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A chapter"),
                                         nbformat.v4.new_code_cell("# Colab only")])
    nbformat.write(nb, tmp_path / "notebooks" / "00_a.ipynb")
    headers.sync(tmp_path)
    release.git(tmp_path, "init", "-q")
    commit(tmp_path, "first")
    return tmp_path


def commit(root: pathlib.Path, message: str) -> None:
    release.git(root, "add", "-A")
    release.git(root, "commit", "-q", "--allow-empty", "-m", message)


def test_release_tags_this_commit_once(repo, capsys):
    tag = headers.pinned_ref(repo)
    assert release.release(repo, dry_run=True) == tag and release.commit_of(repo, tag) is None
    assert release.release(repo) == tag
    assert release.commit_of(repo, tag) == release.commit_of(repo, "HEAD")
    assert release.git(repo, "cat-file", "-t", f"refs/tags/{tag}").stdout.strip() == "tag"  # annotated
    assert release.release(repo) == tag and "already names this commit" in capsys.readouterr().out
    assert release.recorded(repo) == {tag: release.commit_of(repo, "HEAD")}
    commit(repo, "record the release")
    release.git(repo, "tag", "-d", tag)  # a clone without tags, as CI makes one
    assert release.release_commit(repo, tag) == release.commit_of(repo, "HEAD~1")
    release.git(repo, "tag", "-a", tag, "-m", "elsewhere")  # a tag that disagrees with the record
    with pytest.raises(SystemExit, match="releases.json says"):
        release.release_commit(repo, tag)
    release.git(repo, "tag", "-d", tag)
    release.git(repo, "tag", "-a", tag, "-m", "again", "HEAD~1")
    with pytest.raises(SystemExit, match=f"{tag}: the tag exists and names"):
        release.release(repo)


def test_release_refuses_a_dirty_tree_and_stale_headers(repo):
    (repo / "_config.yml").write_text((repo / "_config.yml").read_text() + "\n# edited\n")
    with pytest.raises(SystemExit, match="uncommitted changes"):
        release.release(repo)
    release.git(repo, "checkout", "--", "_config.yml")
    pyproject = repo / "pyproject.toml"
    pyproject.write_text(re.sub(r'(?m)^version = ".*"$', 'version = "9.8.7"', pyproject.read_text()))
    commit(repo, "bump without sync")
    with pytest.raises(SystemExit, match=r"do not name v9\.8\.7 yet \(_config\.yml, notebooks/00_a\.ipynb\)"):
        release.release(repo)
    assert subprocess.run(["git", "tag"], cwd=repo, capture_output=True, text=True).stdout == ""
    headers.sync(repo)
    commit(repo, "sync")
    assert release.release(repo) == "v9.8.7" and release.commit_of(repo, "v9.8.7") is not None
