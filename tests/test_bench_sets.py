"""Recording sets (which GPU's recordings the chapters read), the evidence check, and `bench all`."""
import json
import subprocess

import pytest

from dispatch_book import bench
from dispatch_book.bench import evidence, record, sets

GOOD = "0123456789abcdef0123456789abcdef01234567"


def _doc(name, gpu, date="2026-01-01T00:00:00+00:00", commit=GOOD):
    return {"benchmark": name, "gpu": gpu, "gpu_count": 1, "git_commit": commit, "date": date, "command": "c",
            "versions": {"python": "3", "torch": "t", "triton": "tr", "transformers": "hf"}, "rows": [{"x": 1}]}


def _set(root, slug, gpu, date, skip=(), commit=GOOD):
    (root / slug).mkdir(parents=True, exist_ok=True)
    for name in sets.SET:
        if name not in skip:
            (root / slug / f"{name}.json").write_text(json.dumps(_doc(name, gpu, date, commit)))


def test_the_newest_complete_set_is_the_default(tmp_path, monkeypatch):
    monkeypatch.delenv(sets.ENV, raising=False)
    _set(tmp_path, "h200", "NVIDIA H200", "2026-01-01T00:00:00+00:00")
    _set(tmp_path, "h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "2026-02-01T00:00:00+00:00", skip=("quant",))
    assert sets.missing("h100-80gb-hbm3", tmp_path) == ["quant"]
    assert sets.complete(tmp_path) == ["h200"] and sets.default(tmp_path) == "h200"
    assert bench.load("kernels", root=tmp_path)["gpu"] == "NVIDIA H200", "an incomplete set is never read"
    _set(tmp_path, "h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "2026-02-01T00:00:00+00:00")
    assert sets.complete(tmp_path) == ["h100-80gb-hbm3", "h200"]
    assert bench.load("kernels", root=tmp_path)["gpu"] == "NVIDIA H100 80GB HBM3"


def test_an_optional_suite_comes_from_the_set_else_from_the_gpu_that_recorded_it_last(tmp_path, monkeypatch):
    monkeypatch.delenv(sets.ENV, raising=False)
    _set(tmp_path, "h200", "NVIDIA H200", "2026-01-01T00:00:00+00:00")
    _set(tmp_path, "h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "2026-02-01T00:00:00+00:00", skip=("quant",))
    assert bench.load("serve", root=tmp_path) is None and sets.optional_slug("serve", tmp_path) is None
    for slug, gpu, date in (("h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "2026-03-01T00:00:00+00:00"),
                            ("a100", "NVIDIA A100", "2026-02-15T00:00:00+00:00")):
        (tmp_path / slug).mkdir(exist_ok=True)
        (tmp_path / slug / "serve.json").write_text(json.dumps(_doc("serve", gpu, date)))
    assert sets.default(tmp_path) == "h200", "the h100 set is incomplete: the chapters read the h200's"
    assert bench.load("serve", root=tmp_path)["gpu"] == "NVIDIA H100 80GB HBM3", "the newest recording of it"
    assert bench.load("kernels", root=tmp_path)["gpu"] == "NVIDIA H200", "a suite of the set: the set's"
    (tmp_path / "h200" / "serve.json").write_text(json.dumps(_doc("serve", "NVIDIA H200")))
    assert bench.load("serve", root=tmp_path)["gpu"] == "NVIDIA H200", "the set's own, older or not"


def test_the_environment_names_another_set(tmp_path, monkeypatch):
    _set(tmp_path, "h200", "NVIDIA H200", "2026-01-01T00:00:00+00:00")
    _set(tmp_path, "h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "2026-02-01T00:00:00+00:00")
    monkeypatch.setenv(sets.ENV, "NVIDIA H200")
    assert sets.current(tmp_path) == "h200"
    assert bench.load("decode", root=tmp_path)["gpu"] == "NVIDIA H200"
    monkeypatch.setenv(sets.ENV, "a100")
    with pytest.raises(ValueError, match="there is no results/a100"):
        sets.current(tmp_path)


def test_every_recording_names_what_it_measured():
    assert set(record.PLAN_FILES) == set(sets.SET) | {"book_gpu", "serve", "speculative"}
    for name in (*sets.SET, *sets.OPTIONAL, *sets.EXTRA_MEASURES):
        assert sets.measured_paths(name)
    with pytest.raises(ValueError, match="unknown recording"):
        sets.measured_paths("nosuch")


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.email=a@b", "-c", "user.name=a", "-C", str(repo), *args], check=True,
                   capture_output=True)


def _repo(tmp_path):
    repo = tmp_path / "repo"
    (repo / "dispatch" / "kernels").mkdir(parents=True)
    (repo / "dispatch" / "kernels" / "routing.py").write_text("x = 1\n")
    (repo / "notebooks").mkdir()
    (repo / "notebooks" / "01_x.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": ['doc = bench.load("routing_sort")\n'], "outputs": []},
        {"cell_type": "code", "source": ['sp = bench.load("decode_split", gpu="h100-80gb-hbm3")'], "outputs": []}]}))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "one")
    return repo, subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()


def test_a_recording_turns_stale_when_its_code_changes(tmp_path):
    repo, first = _repo(tmp_path)
    assert evidence.changed(first, ("dispatch/kernels/routing.py",), repo) == ()
    nb = repo / "notebooks" / "01_x.ipynb"
    doc = json.loads(nb.read_text())
    doc["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["new output"]}]
    nb.write_text(json.dumps(doc))
    (repo / "dispatch" / "kernels" / "routing.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "two")
    assert evidence.changed(first, ("dispatch/kernels/routing.py", "notebooks"), repo) == (
        "dispatch/kernels/routing.py",), "a notebook whose code cells are the same does not count"
    assert evidence.changed("f" * 40, ("dispatch",), repo) is None


def test_the_check_fails_on_dirty_unknown_and_missing_recordings(tmp_path, monkeypatch):
    monkeypatch.delenv(sets.ENV, raising=False)
    repo, first = _repo(tmp_path)
    _set(repo / "results", "h200", "NVIDIA H200", "2026-01-01T00:00:00+00:00", commit=first)
    fails, lines = evidence.check(repo)
    assert fails == ["01_x read results/h100-80gb-hbm3/decode_split.json, which is missing"]
    (repo / "results" / "h100-80gb-hbm3").mkdir()
    (repo / "results" / "h100-80gb-hbm3" / "decode_split.json").write_text(json.dumps(
        _doc("decode_split", "NVIDIA H100 80GB HBM3", commit=first + "+dirty")))
    (repo / "results" / "h200" / "quant.json").write_text(json.dumps(_doc("quant", "NVIDIA H200", commit=GOOD)))
    fails, _ = evidence.check(repo)
    assert any("uncommitted code" in f for f in fails)
    assert any(f"names commit {GOOD}, which is not in the history of HEAD" in f for f in fails)
    (repo / "results" / "h200" / "routing_sort.json").unlink()
    fails, _ = evidence.check(repo)
    assert any("no set is complete" in f and "h200 lacks routing_sort" in f for f in fails)


def test_a_recording_read_from_every_gpu_that_holds_it_may_be_missing_yet(tmp_path, monkeypatch):
    monkeypatch.delenv(sets.ENV, raising=False)
    repo, first = _repo(tmp_path)
    _set(repo / "results", "h200", "NVIDIA H200", "2026-01-01T00:00:00+00:00", commit=first)
    (repo / "results" / "h100-80gb-hbm3").mkdir()
    (repo / "results" / "h100-80gb-hbm3" / "decode_split.json").write_text(json.dumps(
        _doc("decode_split", "NVIDIA H100 80GB HBM3", commit=first)))
    (repo / "notebooks" / "10_y.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": ['for slug, doc in sets.recordings("disagg_ipc").items():'], "outputs": []}]}))
    root = repo / "results"
    assert sets.recordings("disagg_ipc", root) == {}
    fails, lines = evidence.check(repo)
    assert fails == [] and "10_y read 'disagg_ipc' from every GPU that recorded it: not recorded on a GPU yet" in lines
    (root / "cpu").mkdir()
    (root / "cpu" / "disagg_ipc.json").write_text(json.dumps(_doc("disagg_ipc", "cpu", commit=first)))
    (root / "h200" / "disagg_ipc.json").write_text(json.dumps(_doc("disagg_ipc", "NVIDIA H200", commit=first)))
    assert list(sets.recordings("disagg_ipc", root)) == ["h200"], "a CPU run never stands in for a GPU"
    fails, lines = evidence.check(repo)
    assert fails == [] and any(line.endswith("recorded it: results/h200/disagg_ipc.json") for line in lines)
    with pytest.raises(ValueError, match="unknown recording"):
        sets.recordings("nonesuch", root)
    (repo / "notebooks" / "10_y.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "code", "source": ['sets.recordings("nonesuch")'], "outputs": []}]}))
    fails, _ = evidence.check(repo)
    assert fails == ["10_y read 'nonesuch' from every GPU, but it is not in EXTRA_MEASURES"]


def test_the_evidence_check_passes_on_this_checkout():
    top = evidence.repo()
    if top is None:
        pytest.skip("not a git checkout")
    fails, _ = evidence.check(top)
    assert fails == []


def test_record_skips_steps_finished_from_this_commit(tmp_path):
    folder = tmp_path / "h200"
    folder.mkdir()
    step = next(s for s in record.PLAN if s.name == "e2e")
    for name in step.files:
        (folder / f"{name}.json").write_text(json.dumps(_doc(name, "NVIDIA H200")))
    assert not record.done(step, folder, GOOD), "no record of a finished run"
    record.finish(step, folder, GOOD, 12.5, rc=124)
    assert not record.done(step, folder, GOOD), "a run stopped at its time limit is not done"
    assert record.expected_s(step, folder) == max(1.5 * 12.5, step.guess_s), "it needs more than it had"
    record.finish(step, folder, GOOD, 400.0, rc=124)
    assert record.expected_s(step, folder) == 600.0
    record.finish(step, folder, GOOD, 12.5, rc=0)
    assert record.done(step, folder, GOOD) and not record.done(step, folder, "f" * 40)
    assert record.expected_s(step, folder) == 12.5
    record.finish(step, folder, "f" * 40, 3.0, rc=1)  # a later run that failed: not done, its seconds kept
    assert not record.done(step, folder, GOOD) and record.expected_s(step, folder) == 3.0
    other = next(s for s in record.PLAN if s.name == "decode")
    assert record.expected_s(other, folder) == other.guess_s
    (folder / "e2e_profile.json").unlink()
    record.finish(step, folder, GOOD, 1.0, rc=0)
    assert not record.done(step, folder, GOOD), "a recording the step writes is missing"


def test_record_refuses_a_dirty_tree_and_lists_the_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", GOOD + "+dirty")
    with pytest.raises(ValueError, match="uncommitted"):
        record.main(["--list", "--out", str(tmp_path)])
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", GOOD)
    record.main(["--list", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "0 of" in out and all(s.name in out for s in record.PLAN)


def test_record_reuses_a_step_whose_code_did_not_change_only_when_asked(tmp_path, monkeypatch):
    repo, first = _repo(tmp_path)
    folder = tmp_path / "h200"
    folder.mkdir()
    step = next(s for s in record.PLAN if s.name == "routing_sort")
    (folder / "routing_sort.json").write_text(json.dumps(_doc("routing_sort", "NVIDIA H200", commit=first)))
    record.finish(step, folder, first, 9.0, rc=0)
    monkeypatch.setattr(evidence, "repo", lambda: repo)
    (repo / "notes.txt").write_text("unrelated\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "unrelated")
    later = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert not record.done(step, folder, later) and record.done(step, folder, later, reuse_fresh=True)
    (repo / "dispatch" / "kernels" / "routing.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "routing changed")
    assert not record.done(step, folder, later, reuse_fresh=True), "what it measured changed since"


def test_a_later_layers_race_keeps_the_fresh_rows_of_earlier_layers_and_replaces_stale_ones(tmp_path, monkeypatch):
    repo, first = _repo(tmp_path)
    monkeypatch.setattr(evidence, "repo", lambda: repo)
    (repo / "notes.txt").write_text("unrelated\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "unrelated")
    later = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    race = next(s for s in record.PLAN if s.name == "kernels:mixtral-8x7b")
    older = _doc("kernels", "NVIDIA H200", commit=first)
    assert record.keeps(race, _doc("kernels", "NVIDIA H200", commit=later), later), "its own commit"
    assert record.keeps(race, older, later), "nothing the race measures changed since: kept, merged into"
    assert not record.keeps(race, {**older, "git_commit": first + "+dirty"}, later), "a dirty run is replaced"
    routing = next(s for s in record.PLAN if s.name == "routing_sort")
    assert not record.keeps(routing, _doc("routing_sort", "NVIDIA H200", commit=first), later), \
        "a step that does not merge replaces a recording of another commit"
    serving = [s for s in record.PLAN if s.files == ("serve",)]
    assert len(serving) == 2 and {a for s in serving for a in s.argv[s.argv.index("--parts") + 1].split(",")} == \
        {"step", "offline", "online", "reliability"}, "chapter 8's four parts, in two steps"
    assert all(record.keeps(s, _doc("serve", "NVIDIA H200", commit=first), later) for s in serving), \
        "each serving step merges into the other's rows"
    monkeypatch.setattr(evidence, "repo", lambda: None)
    assert record.keeps(race, older, later), "no checkout (a GPU machine's copy): kept; the evidence check decides"
    monkeypatch.setattr(evidence, "repo", lambda: repo)
    (repo / "dispatch" / "kernels" / "routing.py").write_text("x = 3\n")
    _git(repo, "commit", "-qam", "kernels changed")
    assert not record.keeps(race, older, later), "what the earlier run measured changed since: replaced"


def test_a_docstring_or_comment_changes_nothing_measured(tmp_path):
    repo, first = _repo(tmp_path)
    (repo / "dispatch" / "kernels" / "routing.py").write_text('"""Routing."""\n# why\nx = 1\n')
    _git(repo, "commit", "-qam", "words only")
    assert evidence.changed(first, ("dispatch/kernels",), repo) == ()
    (repo / "dispatch" / "kernels" / "routing.py").write_text('"""Routing."""\nx = 2\n')
    _git(repo, "commit", "-qam", "code")
    assert evidence.changed(first, ("dispatch/kernels",), repo) == ("dispatch/kernels/routing.py",)


def test_an_added_module_counts_only_through_the_code_that_imports_it(tmp_path):
    repo, first = _repo(tmp_path)
    (repo / "dispatch" / "kernels" / "copy.py").write_text("y = 1\n")
    (repo / "dispatch" / "kernels" / "table.json").write_text("{}\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "a new module and a new table")
    assert evidence.changed(first, ("dispatch/kernels",), repo) == ("dispatch/kernels/table.json",), \
        "a data file is looked up by name: added, it counts"
    (repo / "dispatch" / "kernels" / "routing.py").write_text("from . import copy\nx = 1\n")
    _git(repo, "commit", "-qam", "routing uses it")
    assert evidence.changed(first, ("dispatch/kernels",), repo) == (
        "dispatch/kernels/routing.py", "dispatch/kernels/table.json")


def test_a_wrapped_staleness_note_fits_the_column_and_nbval_removes_it(monkeypatch):
    """The note depends on commits made since, not on the computation: nbval's sanitizer removes it
    whole, however the book's column (88 characters) or a chapter's own fill() wrapped it."""
    import configparser
    import pathlib
    import re
    import textwrap

    from dispatch_book.bench import results

    paths = ", ".join(f"dispatch/kernels/file_{i}.py" for i in range(12))
    note = (f"Stale: recorded at 0123456789ab, 2026-12-04; {paths} changed since; "
            f"recorded at ba9876543210, 2026-12-05; {paths} changed since.")
    monkeypatch.setattr(evidence, "stale_note", lambda doc: note)
    doc = {"versions": {"torch": "2.11", "triton": "3.6", "transformers": "5.17"}, "gpu": "NVIDIA H100",
           "date": "2026-12-04T00:00:00Z", "git_commit": "0" * 40, "command": "python -m x"}
    shown = results.provenance(doc)
    assert max(map(len, shown.splitlines())) <= 88 and len(shown.splitlines()) > 3
    cfg = configparser.ConfigParser()
    cfg.read(pathlib.Path(__file__).parents[1] / ".nbval_sanitize.cfg")
    rules = [(cfg[s]["regex"], cfg[s]["replace"]) for s in cfg.sections()]

    def sanitize(text):
        for regex, replace in rules:
            text = re.sub(regex, replace, text)
        return text
    plain = results.provenance({**doc})
    monkeypatch.setattr(evidence, "stale_note", lambda doc: None)
    current = results.provenance(doc)
    assert plain != current and sanitize(plain) == sanitize(current)
    refilled = textwrap.fill(plain + " tail", width=60)  # a chapter's fill() joins the note into a paragraph
    assert "Stale" not in sanitize(refilled) and sanitize(refilled).endswith(" tail")
    cut = f"ceilings measured: {plain.rstrip('.')}; the rest from the datasheet"  # peaks.ceilings drops the period
    assert sanitize(cut) == f"ceilings measured: {sanitize(current)}; the rest from the datasheet"


def test_no_code_a_set_measures_imports_the_kernels_it_leaves_out():
    """sets.NOT_IN_SET leaves the serving, handoff and peer-copy kernels out of the set's suites: no file
    those suites measure may import them, or the packages that run them (dispatch.serve, dispatch.parallel),
    or dispatch.ops (which reaches every kernel). Imports read as the layer check reads them."""
    import pathlib

    from test_layers import imports, modules

    top = pathlib.Path(__file__).resolve().parents[1]
    known = set(modules(top / "dispatch"))
    left = {p.removeprefix(":(exclude)") for p in sets.NOT_IN_SET}
    banned = {p.removesuffix(".py").replace("/", ".") for p in left} | {"dispatch.serve", "dispatch.parallel",
                                                                      "dispatch.ops"}
    files = set()
    for name in sets.SET:
        for p in sets.measured_paths(name):
            if not p.startswith(":"):
                files |= {top / p} if p.endswith(".py") else set((top / p).rglob("*.py"))
    assert len(files) > 40
    bad = []
    for f in sorted(files):
        rel = f.relative_to(top).as_posix()
        if rel in left:
            continue
        mod = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        bad += [f"{rel}:{line} imports {m}" for m, line in imports(mod, f, known)
                if any(m == b or m.startswith(b + ".") for b in banned)]
    assert not bad, "; ".join(bad) + ": measure it in sets.MEASURES (drop it from NOT_IN_SET) or import elsewhere"


def test_a_kernel_left_out_of_the_set_leaves_it_current(tmp_path):
    repo, first = _repo(tmp_path)
    (repo / "dispatch" / "kernels" / "block_copy.py").write_text("y = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "two")
    second = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    (repo / "dispatch" / "kernels" / "block_copy.py").write_text("y = 2\n")
    _git(repo, "commit", "-qam", "three")
    assert evidence.changed(second, sets.measured_paths("decode"), repo) == ()
    assert evidence.changed(second, sets.measured_paths("disagg_ipc"), repo) == ("dispatch/kernels/block_copy.py",)
    assert evidence.changed(first, ("dispatch/kernels", *sets.NOT_IN_SET), repo) == ()
