"""python -m dispatch_book.build on a chapter that hangs or kills its kernel: a per-cell timeout
(configurable), and a message naming the notebook and the cell; the committed notebook untouched."""
import pytest

from dispatch_book import build, execute


def _notebook(path, cells):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_a_dying_kernel_names_the_cell(tmp_path):
    """Was: an uncaught DeadKernelError that did not name the cell."""
    nb = _notebook(tmp_path / "dies.ipynb", ["y = 2", "import os\n\nos._exit(3)", "z = 3"])
    before = nb.read_bytes()
    with pytest.raises(SystemExit) as e:
        execute.run_in_place(nb, {}, tmp_path / "scratch")
    msg = str(e.value)
    assert "dies.ipynb: cell 3 of 4 (`import os`) killed the kernel" in msg, msg
    assert nb.read_bytes() == before


def test_a_cell_that_never_ends_times_out_and_is_named(tmp_path):
    """Was: no timeout at all (the build hung)."""
    nb = _notebook(tmp_path / "hangs.ipynb", ["y = 2", "while True:\n    pass"])
    before = nb.read_bytes()
    with pytest.raises(SystemExit, match=r"hangs.ipynb: cell 3 of 3 \(`while True:`\) ran past the per-cell "
                                         r"timeout of 3 s \(--cell-timeout\)"):
        execute.run_in_place(nb, {}, tmp_path / "scratch", cell_timeout=3)
    assert nb.read_bytes() == before


def test_the_cli_takes_a_cell_timeout_and_names_missing_or_foreign_files(tmp_path):
    nb = _notebook(tmp_path / "hangs.ipynb", ["while True:\n    pass"])
    with pytest.raises(SystemExit, match="timeout of 2 s"):
        build.main(["run", str(nb), "--cell-timeout", "2"])
    with pytest.raises(SystemExit, match="run: no notebook at .*nosuch.ipynb"):  # was: a raw FileNotFoundError
        build.main(["run", str(tmp_path / "nosuch.ipynb")])
    (tmp_path / "README.md").write_text("# not a notebook\n")
    # was: "Notebook does not appear to be JSON"
    with pytest.raises(SystemExit, match=r"README.md is not a notebook \(.ipynb\)"):
        build.main(["run", str(tmp_path / "README.md")])
    with pytest.raises(SystemExit) as e:
        build.main(["run", str(nb), "--cell-timeout", "-1"])
    assert e.value.code == 2
    assert execute.CELL_TIMEOUT_S > 0  # a default limit: a hang never blocks a build for ever
