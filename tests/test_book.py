"""The book's plumbing: one repository address, chapter headers, parameters cells, dependencies."""
import json
import pathlib
import re
import shutil

import pytest
import yaml

from dispatch_book import build as book
from dispatch_book import execute, gpu_book, headers

ROOT = book.set_root(pathlib.Path(__file__).resolve().parents[1])
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


def test_launch_buttons_open_the_tag_the_colab_cells_install():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    ref = headers.pinned_ref(ROOT)
    assert cfg["repository"]["branch"] == ref, "run `python -m dispatch_book.build sync`"
    assert cfg["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert cfg["launch_buttons"]["binderhub_url"] == "https://mybinder.org"
    assert f"@{ref}" in book.install_source()
    for nb in NOTEBOOKS:
        badge = "".join(json.loads(nb.read_text())["cells"][0]["source"])
        assert f"/blob/{ref}/notebooks/{nb.name}" in badge, f"{nb.name}: run `python -m dispatch_book.build sync`"


def test_sync_writes_the_address_and_the_tag_into_the_config(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    stale = (ROOT / "_config.yml").read_text().replace(book.repo_url(), "https://github.com/someone/old")
    (tmp_path / "_config.yml").write_text(re.sub(r"(?m)^  branch: .*$", "  branch: main", stale))
    assert headers.sync(tmp_path) == [tmp_path / "_config.yml"]
    cfg = yaml.safe_load((tmp_path / "_config.yml").read_text())
    assert cfg["repository"] == {**cfg["repository"], "url": book.repo_url(), "branch": headers.pinned_ref(ROOT)}
    assert headers.sync(tmp_path) == []


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
        assert "NBVAL" not in src, f"{nb.name}: nbval markers are cell tags (nbval-ignore-output), hidden from readers"
        if "nbval-ignore-output" in c.get("metadata", {}).get("tags", []):
            # the reader sees why the output varies: the cell's first line is a comment saying so.
            first = src.splitlines()[0] if src.strip() else ""
            assert first.startswith("#") and len(first) > 15, \
                f"{nb.name}: a cell tagged nbval-ignore-output must open with a comment saying why its output varies"
        assert not any(o.get("output_type") == "error" for o in c.get("outputs", [])), f"{nb.name}: error output"


def test_conda_environment_matches_pyproject():
    deps = headers.pyproject(ROOT)["project"]
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


def test_pipeline_injects_declared_parameters_and_refuses_unknown_ones(tmp_path):
    import nbformat

    nb = tmp_path / "ok.ipynb"
    _tiny_notebook(nb, ["print(x + y)"])
    assert execute.params_for(nb, {"x": 40, "preset": "olmoe-1b-7b"}, strict=False) == {"x": 40}
    with pytest.raises(ValueError, match=r"no parameter 'preset'; its parameters are: x, y"):
        execute.params_for(nb, {"x": 40, "preset": "olmoe-1b-7b"}, strict=True)
    execute.execute(nb, nb, {"x": 40})
    out = nbformat.read(nb, as_version=4).cells[-1].outputs[0]["text"]
    assert out.strip() == "42"


def test_a_failing_cell_names_the_notebook_and_the_cell(tmp_path):
    nb = tmp_path / "broken.ipynb"
    _tiny_notebook(nb, ["print('fine')", "raise RuntimeError('the kernel exploded')"])
    with pytest.raises(SystemExit) as err:
        execute.execute(nb, tmp_path / "out.ipynb")
    msg = str(err.value)
    assert "broken.ipynb" in msg and "cell 3" in msg and "the kernel exploded" in msg


@pytest.mark.parametrize("cells, params, error", [
    (["print('fine')", "raise RuntimeError('boom')"], {}, SystemExit),  # a failing cell
    (["assert isinstance(x, int), 'x must be an int'"], {"x": "not a number"}, SystemExit),  # a bad value
    (["print(x)"], {"z": 1}, ValueError),  # an unknown name: refused before running
])
def test_run_replaces_the_committed_notebook_only_after_a_whole_success(tmp_path, cells, params, error):
    nb = tmp_path / "nb.ipynb"
    _tiny_notebook(nb, cells)
    before = nb.read_bytes()
    with pytest.raises(error):
        execute.run_in_place(nb, params, tmp_path / "scratch")
    assert nb.read_bytes() == before


def test_run_refreshes_outputs_on_success(tmp_path):
    import nbformat

    nb = tmp_path / "nb.ipynb"
    _tiny_notebook(nb, ["print(x * 10)"])
    execute.run_in_place(nb, {"x": 7}, tmp_path / "scratch")
    done = nbformat.read(nb, as_version=4)
    assert done.cells[-1].outputs[0]["text"].strip() == "70"
    assert done.metadata["papermill"]["input_path"] == "nb.ipynb" == done.metadata["papermill"]["output_path"]
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".ipynb"] == ["nb.ipynb"]


def test_cli_rejects_unknown_book_wide_parameters():
    with pytest.raises(SystemExit, match="no chapter has a parameter 'presett'"):
        book.check_overrides(NOTEBOOKS, {"presett": "tiny"})
    book.check_overrides(NOTEBOOKS, {"preset": "tiny", "seed": 1})


def test_colab_cell_never_reinstalls_what_colab_has():
    src = book.install_source()
    assert 'if "google.colab" in sys.modules:' in src and "--no-deps" in src
    installs = [ln for ln in src.splitlines() if "pip install" in ln]
    assert all(ln.startswith("    !pip") for ln in installs), "every install line runs only on Colab"
    for name in ("torch", "triton", "numpy", "matplotlib", "jupyter-book", "papermill", "[book]"):
        assert not re.search(rf'"{re.escape(name)}[<>=\[ "]', src) and f"dispatch{name}" not in src, name
    assert '"transformers>=5.17,<6"' in src


def test_gpu_run_records_rows_per_chapter_with_peak_memory_and_errors(tmp_path, monkeypatch):
    """``build --gpu`` on tiny notebooks (the injected cells also run on a CPU-only kernel)."""
    import json

    monkeypatch.setenv("DISPATCH_GIT_COMMIT", "0123456789abcdef0123456789abcdef01234567")
    good, bad = tmp_path / "a_good.ipynb", tmp_path / "b_bad.ipynb"
    _tiny_notebook(good, ["import os\nprint(os.environ.get('DISPATCH_MAX_SHARED_BYTES'))"])
    _tiny_notebook(bad, ["raise RuntimeError('out of memory, say')"])
    for t4 in (False, True):
        path = gpu_book.run([good, bad], tmp_path / "_build", t4_budget=t4, out=tmp_path / "res", require_cuda=False)
    doc = json.loads(path.read_text())
    rows = {(r["chapter"], r["budget"]): r for r in doc["rows"]}
    assert set(rows) == {("a_good", "full"), ("b_bad", "full"), ("a_good", "t4"), ("b_bad", "t4")}
    assert rows["a_good", "full"]["ok"] and rows["a_good", "full"]["error"] is None
    assert rows["a_good", "full"]["peak_gpu_bytes"] is None  # no CUDA in this kernel; a number on a GPU
    assert not rows["b_bad", "t4"]["ok"] and "out of memory, say" in rows["b_bad", "t4"]["error"]
    assert rows["b_bad", "t4"]["seconds"] >= 0
    executed = (tmp_path / "_build" / "gpu" / "t4" / "a_good.ipynb").read_text()
    assert "65536" in executed and "set_per_process_memory_fraction" in executed
    assert "set_per_process_memory_fraction" not in (tmp_path / "_build" / "gpu" / "full" / "a_good.ipynb").read_text()
    assert good.read_text().count("injected") == 0, "the chapters themselves are never changed"
    gpu_book.run([good], tmp_path / "_build", out=tmp_path / "res", require_cuda=False)  # one chapter again
    again = json.loads(path.read_text())["rows"]
    assert len(again) == 4 and sum(r["chapter"] == "a_good" and r["budget"] == "full" for r in again) == 1


def test_build_finds_the_checkout_from_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT / "notebooks")
    assert book.find_root() == ROOT
    with pytest.raises(SystemExit, match="no checkout"):
        book.find_root(tmp_path)


def test_code_cells_fit_the_page():
    """Code lines within the 88-character column and cells of at most 25 lines (longer logic lives in
    the package): what the built page shows without a scroll bar."""
    long = []
    for nb in NOTEBOOKS:
        for i, c in enumerate(json.loads(nb.read_text())["cells"]):
            lines = "".join(c["source"]).splitlines()
            if c["cell_type"] == "code":
                long += [f"{nb.name} cell {i}: {len(lines)} lines"] if len(lines) > 25 else []
                long += [f"{nb.name} cell {i}: {len(ln)} chars: {ln[:40]}" for ln in lines if len(ln) > 88]
    assert long == []


def test_glue_is_a_no_op_without_myst_nb(monkeypatch, capsys):
    """On Colab (no myst-nb) the chapters' glue calls must not fail: they do nothing."""
    import sys

    from dispatch_book.checks import glue

    monkeypatch.setitem(sys.modules, "myst_nb", None)  # import myst_nb now raises ImportError
    assert glue("x", "1.0%") is None
    assert capsys.readouterr().out == ""


def test_every_glue_a_page_names_is_glued_by_its_chapter():
    """A {glue:text}`name` in a chapter's prose is glued in the chapter's committed outputs (else the
    page would show a warning instead of the number)."""
    missing = []
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        text = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        glued = {o.get("metadata", {}).get("scrapbook", {}).get("name")
                 for c in cells if c["cell_type"] == "code" for o in c.get("outputs", [])}
        missing += [f"{nb.name}: {n}" for n in set(re.findall(r"\{glue:\w*\}`([^`:]+)", text)) - glued]
    assert missing == []


def test_chapter_titles_are_numbered_alike():
    """``NN_name`` is "Chapter N", N = 0, 1, 2, ... in reading order; an interlude after chapter N,
    ``NNb_name``, is "Chapter N.5"; chapter N's lab notes, ``NN_lab_notes``, are "Chapter N lab notes"
    and follow it."""
    def number(nb):
        m = re.match(r"(\d\d)(b?)_", nb.name)
        assert m, f"{nb.name}: a chapter's file is NN_name or NNb_name"
        return f"{int(m[1])}.5" if m[2] else str(int(m[1]))

    def heading(nb):
        return f"# Chapter {number(nb)}" + (" lab notes" if nb.stem.endswith("_lab_notes") else "")

    titles = [json.loads(nb.read_text())["cells"][0]["source"][0] for nb in NOTEBOOKS]
    assert [t.split(":")[0] for t in titles] == [heading(nb) for nb in NOTEBOOKS], titles
    order = [nb.stem for nb in NOTEBOOKS]
    for i, stem in enumerate(order):
        if stem.endswith("_lab_notes"):
            assert order[i - 1].startswith(stem[:3]), f"{stem} follows its chapter"
    whole = [int(number(nb)) for nb in NOTEBOOKS if "." not in number(nb) and not nb.stem.endswith("_lab_notes")]
    assert whole == list(range(len(whole))), whole


def test_the_readme_snippet_runs_here():
    """README's "Using the package" block, as a reader pastes it: on this machine's device (no GPU
    named in it), the layer and the module agree."""
    import torch

    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using the package"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert "cuda" not in code.replace("a CUDA GPU", "")
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    y, layer, x = scope["y"], scope["layer"], scope["x"]
    assert y.shape == x.shape and torch.isfinite(y).all()
    torch.testing.assert_close(layer(x), y)


def test_stream_pieces_are_joined_and_nothing_else_is():
    """A print that arrived in pieces is one output; another stream, or a result between, stays apart."""
    def out(name, text):
        return {"output_type": "stream", "name": name, "text": text}

    o = [out("stdout", "a"), out("stdout", ["b\n", "c"]), out("stderr", "w"), out("stdout", "d"),
         {"output_type": "execute_result", "data": {}}, out("stdout", "e")]
    got = execute.coalesce_streams(o)
    assert [(g["output_type"], g.get("name"), "".join(g.get("text", ""))) for g in got] == [
        ("stream", "stdout", "ab\nc"), ("stream", "stderr", "w"), ("stream", "stdout", "d"),
        ("execute_result", None, ""), ("stream", "stdout", "e")]
