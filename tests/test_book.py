"""The book's plumbing: one repository address, chapter headers, parameters cells, dependencies."""
import json
import pathlib
import re

import pytest
import yaml

from dispatch_book import build as book

ROOT = book.ROOT
NOTEBOOKS = book.chapters()


def test_every_chapter_in_toc_exists():
    toc = (ROOT / "_toc.yml").read_text()
    listed = re.findall(r"file: (notebooks/\S+)", toc)
    assert listed, "the _toc.yml lists no chapters"
    assert [f"{p.parent.name}/{p.stem}" for p in NOTEBOOKS] == listed


def test_repository_url_in_one_place():
    url = book.repo_url()
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["repository"]["url"] == url
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        badge, install = "".join(cells[0]["source"]), "".join(cells[1]["source"])
        title = re.match(r"# (.+)", badge).group(1)
        assert badge.startswith(book.badge_source(nb, title)), f"{nb.name}: run `python -m dispatch_book.build sync`"
        assert install == book.install_source(), f"{nb.name}: run `python -m dispatch_book.build sync`"
        assert url.removeprefix("https://github.com/") in badge and url in install


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_structure(nb):
    data = json.loads(nb.read_text())
    cells = data["cells"]
    assert cells[0]["cell_type"] == "markdown" and "".join(cells[0]["source"]).startswith("# ")
    params = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{nb.name}: exactly one cell tagged 'parameters'"
    assert re.search(r"^device\s*=", "".join(params[0]["source"]), re.M), f"{nb.name}: no `device` parameter"
    assert data["metadata"].get("accelerator") == "GPU"
    for c in cells:
        if c["cell_type"] != "code":
            continue
        src = "".join(c["source"])
        assert c.get("execution_count") is not None or not src.strip() or c is cells[1], \
            f"{nb.name}: a code cell has no stored output; run `python -m dispatch_book.build run {nb.name}`"
        if "NBVAL_IGNORE_OUTPUT" in src:
            # nbval honours only the bare marker line; the next line must say why the output varies.
            lines = src.splitlines()
            i = lines.index("# NBVAL_IGNORE_OUTPUT")
            assert i + 1 < len(lines) and lines[i + 1].startswith("#") and len(lines[i + 1]) > 15, \
                f"{nb.name}: the line after '# NBVAL_IGNORE_OUTPUT' must be a comment saying why"
        assert not any(o.get("output_type") == "error" for o in c.get("outputs", [])), f"{nb.name}: error output"


def test_conda_environment_matches_pyproject():
    deps = book._pyproject()["project"]
    wanted = set(deps["dependencies"]) | set(deps["optional-dependencies"]["book"]) | set(
        deps["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d for d in env["dependencies"] if isinstance(d, dict))["pip"]
    names = lambda specs: {re.split(r"[<>=!\[ ]", s, maxsplit=1)[0].lower() for s in specs}  # noqa: E731
    assert names(wanted) - {"torch"} == names(p for p in pip if not p.startswith("-"))


def _tiny_notebook(path, cells):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1\ny = 2", metadata={"tags": ["parameters"]})]
    nb.cells += [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_pipeline_injects_only_declared_parameters(tmp_path):
    import nbformat

    nb = tmp_path / "ok.ipynb"
    _tiny_notebook(nb, ["print(x + y)"])
    assert book._params_for(nb, {"x": 40, "preset": "olmoe-1b-7b"}) == {"x": 40}
    book.execute(nb, nb, {"x": 40, "preset": "olmoe-1b-7b"})
    out = nbformat.read(nb, as_version=4).cells[-1].outputs[0]["text"]
    assert out.strip() == "42"


def test_a_failing_cell_names_the_notebook_and_the_cell(tmp_path):
    nb = tmp_path / "broken.ipynb"
    _tiny_notebook(nb, ["print('fine')", "raise RuntimeError('the kernel exploded')"])
    with pytest.raises(SystemExit) as err:
        book.execute(nb, tmp_path / "out.ipynb")
    msg = str(err.value)
    assert "broken.ipynb" in msg and "cell 3" in msg and "the kernel exploded" in msg
