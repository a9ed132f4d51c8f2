"""The wheel ships what a non-editable install needs to run every chapter; building it from a
checkout warns about nothing of ours and leaves the checkout as it was."""
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def tracked_copy(dest: pathlib.Path) -> pathlib.Path:
    """The files a clone has (tracked, or new and not ignored), copied to ``dest``."""
    ls = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                        capture_output=True, text=True)
    if ls.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the repository's files from build leftovers")
    for name in filter(None, ls.stdout.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the source tree after the build, the files it had before, the wheel, pip's output)."""
    src = tracked_copy(tmp_path_factory.mktemp("src"))
    before = {p.relative_to(src) for p in src.rglob("*")}
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(out), str(src)]
    try:
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 77:
            cmd.insert(4, "--no-build-isolation")  # no download when this environment can build it
    except ImportError:
        pass
    res = subprocess.run(cmd, cwd=out, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (wheel,) = out.glob("dispatch-*.whl")
    return src, before, wheel, res.stdout + res.stderr


def test_wheel_ships_the_recorded_results_and_the_checkpoint(built):
    _, _, wheel, _ = built
    names = set(zipfile.ZipFile(wheel).namelist())
    results = [p.relative_to(ROOT / "results").as_posix() for p in (ROOT / "results").rglob("*.json")]
    assets = [p.relative_to(ROOT).as_posix() for p in (ROOT / "dispatch" / "assets").rglob("*") if p.is_file()]
    assert results and assets
    assert {f"dispatch_book/results/{r}" for r in results} <= names
    assert "dispatch_book/results/__init__.py" in names
    assert set(assets) <= names and "dispatch/assets/cpu/hashes.json" in names
    assert {"dispatch/__init__.py", "dispatch_book/bench/core.py", "dispatch_book/build.py"} <= names
    assert not any(n.startswith(("tests/", "notebooks/", "results/")) for n in names)


def test_the_build_warns_about_nothing_of_ours(built):
    _, _, _, log = built
    for warning in ("Package would be ignored", "is deprecated", "SetuptoolsDeprecationWarning"):
        assert warning not in log, f"the build says {warning!r}:\n" + log[log.find(warning) - 600:][:1500]


def test_the_build_leaves_the_checkout_as_it_was(built):
    src, before, _, _ = built
    left = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.relative_to(src) not in before)
    assert left == [], f"the build left files in the source tree: {left[:10]}"
