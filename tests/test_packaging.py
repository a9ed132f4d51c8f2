"""The wheel ships what a non-editable install needs to run every chapter."""
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_ships_the_recorded_results_and_the_checkpoint(tmp_path):
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)]
    try:
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 68:
            cmd.insert(4, "--no-build-isolation")  # no download when this environment can build it
    except ImportError:
        pass
    subprocess.run(cmd, check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("dispatch-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    results = [p.relative_to(ROOT / "results").as_posix() for p in (ROOT / "results").rglob("*.json")]
    assets = [p.relative_to(ROOT).as_posix() for p in (ROOT / "dispatch" / "assets").rglob("*") if p.is_file()]
    assert results and assets
    assert {f"dispatch_book/results/{r}" for r in results} <= names
    assert "dispatch_book/results/__init__.py" in names
    assert set(assets) <= names and "dispatch/assets/cpu/hashes.json" in names
    assert {"dispatch/__init__.py", "dispatch_book/bench/core.py", "dispatch_book/build.py"} <= names
    assert not any(n.startswith(("tests/", "notebooks/", "results/")) for n in names)
