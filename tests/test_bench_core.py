"""The benchmark harness and results files: save / load / provenance / ceilings / the CLI."""
import json

import pytest

from dispatch_book import bench
from dispatch_book.bench import core, peaks, results

GOOD = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def commit(monkeypatch):
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", GOOD)
    monkeypatch.setattr(results, "_cli", {"out": None, "allow_dirty": False})


def _doc(gpu, date="2026-01-01T00:00:00+00:00", **rows):
    return {"benchmark": "kernels", "gpu": gpu, "gpu_count": 1, "git_commit": GOOD, "date": date, "command": "c",
            "versions": {"python": "3", "torch": "t", "triton": "tr", "transformers": "hf"}, "rows": [rows or {"x": 1}]}


def _write(root, slug, doc, name="kernels"):
    (root / slug).mkdir(parents=True, exist_ok=True)
    (root / slug / f"{name}.json").write_text(json.dumps(doc))


def test_save_records_provenance_into_the_scratch_folder_by_default(tmp_path, monkeypatch, commit):
    monkeypatch.chdir(tmp_path)
    rows = [{"shape": "tiny", "T": 4, **bench.time_ms(lambda: sum(range(10)))}]
    path = bench.save("demo", rows, command="python -m x")
    assert path == tmp_path / "_build" / "results" / "cpu" / "demo.json"
    doc = json.loads(path.read_text())
    assert doc["git_commit"] == GOOD and doc["gpu"] == "cpu" and doc["command"] == "python -m x"
    assert set(doc["versions"]) == {"python", "torch", "triton", "transformers"} and doc["date"].startswith("20")
    assert doc["rows"][0]["median_ms"] >= doc["rows"][0]["min_ms"] >= 0 and doc["rows"][0]["samples"] >= 3
    assert sorted(p.name for p in path.parent.iterdir()) == ["demo.json"], "no temporary file left behind"
    assert bench.provenance(doc).startswith("Recorded on 1x cpu on 20")
    labelled = bench.provenance(dict(doc, command="python -m " + "x" * 70), label="demo")
    assert labelled.startswith("demo: Recorded on 1x cpu on 20") and "\n " not in labelled
    assert max(map(len, labelled.splitlines())) <= 88, "the label is wrapped with the sentence, not before it"


def test_save_out_argument_and_cli_default(tmp_path, commit):
    assert bench.save("a", [{"x": 1}], out=tmp_path / "o").parent == tmp_path / "o" / "cpu"
    bench.configure(out=tmp_path / "cli")
    assert bench.save("a", [{"x": 1}]).parent == tmp_path / "cli" / "cpu"
    assert bench.save("a", [{"x": 1}], out=tmp_path / "o2").parent == tmp_path / "o2" / "cpu"


def test_save_refuses_an_unknown_commit(tmp_path, monkeypatch, commit):
    monkeypatch.delenv("DISPATCH_GIT_COMMIT")
    monkeypatch.chdir(tmp_path)  # not a git checkout
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    with pytest.raises(ValueError, match="DISPATCH_GIT_COMMIT"):
        bench.save("demo", [{"x": 1}], out=tmp_path)
    assert not (tmp_path / "cpu").exists()


@pytest.mark.parametrize("bad", ["nope", "12345", "xyz1234567"])
def test_save_refuses_a_malformed_commit(tmp_path, monkeypatch, commit, bad):
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", bad)
    with pytest.raises(ValueError, match="hex commit"):
        bench.save("demo", [{"x": 1}], out=tmp_path)


def test_save_refuses_dirty_unless_asked(tmp_path, monkeypatch, commit):
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", GOOD[:10] + "+dirty")
    with pytest.raises(ValueError, match="allow-dirty"):
        bench.save("demo", [{"x": 1}], out=tmp_path)
    doc = json.loads(bench.save("demo", [{"x": 1}], out=tmp_path, allow_dirty=True).read_text())
    assert doc["git_commit"].endswith("+dirty")


@pytest.mark.parametrize("name, rows", [("Bad-Name", [{"x": 1}]), ("ok", []), ("ok", [1]), ("ok", {"x": 1})])
def test_save_rejects_bad_names_and_rows(tmp_path, commit, name, rows):
    with pytest.raises(ValueError):
        bench.save(name, rows, out=tmp_path)


def test_git_commit_of_a_checkout(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.delenv("DISPATCH_GIT_COMMIT", raising=False)
    git = ["git", "-c", "user.email=a@b", "-c", "user.name=a"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "dispatch").mkdir()
    (tmp_path / "dispatch" / "m.py").write_text("x = 1\n")
    subprocess.run(git + ["-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "m"], check=True)
    clean = results.git_commit(tmp_path)
    assert len(clean) == 40 and "+" not in clean
    (tmp_path / "dispatch" / "m.py").write_text("x = 2\n")
    assert results.git_commit(tmp_path) == clean + "+dirty"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(results, "_cli", {"out": None, "allow_dirty": False})
    with pytest.raises(ValueError, match="uncommitted"):
        bench.save("demo", [{"x": 1}], out=tmp_path / "o")


def test_load_reads_only_gpu_recordings_unless_cpu_is_named(tmp_path):
    _write(tmp_path, "h200", _doc("NVIDIA H200", **{"median_ms": 1.0}))
    _write(tmp_path, "a100-sxm4-80gb", _doc("NVIDIA A100-SXM4-80GB", date="2025-01-01T00:00:00+00:00"))
    _write(tmp_path, "cpu", _doc("cpu", date="2027-01-01T00:00:00+00:00"))
    _write(tmp_path, "tesla-t4", _doc("cpu", date="2028-01-01T00:00:00+00:00"))  # a CPU run in a GPU folder
    assert bench.load("kernels", gpu="NVIDIA H200", root=tmp_path)["rows"] == [{"median_ms": 1.0}]
    assert bench.load("kernels", gpu="a100-sxm4-80gb", root=tmp_path)["gpu"] == "NVIDIA A100-SXM4-80GB"
    assert bench.load("kernels", gpu="tesla-t4", root=tmp_path) is None
    assert bench.load("kernels", gpu="cpu", root=tmp_path)["gpu"] == "cpu"
    assert bench.load("kernels", root=tmp_path) is None, "no complete set: nothing to read by default"
    with pytest.raises(ValueError, match="name the GPU"):
        bench.load("missing", root=tmp_path)


def test_load_refuses_a_recording_of_uncommitted_code(tmp_path):
    _write(tmp_path, "h200", _doc("NVIDIA H200") | {"git_commit": GOOD + "+dirty"})
    with pytest.raises(ValueError, match="uncommitted code"):
        bench.load("kernels", gpu="h200", root=tmp_path)


def test_load_reads_the_packaged_recordings():
    doc = bench.load("kernels", gpu="h200")
    assert doc is not None and doc["gpu"] == "NVIDIA H200" and doc["rows"]
    assert bench.load("balance_study", gpu="cpu")["rows"]
    with pytest.raises(ValueError, match="not one of the recordings of a set"):
        bench.load("balance_study")  # a CPU recording never stands in for a GPU one
    assert results.recorded().joinpath("h200", "ceilings.json").is_file()


def test_provenance_of_nothing_is_a_clear_error():
    with pytest.raises(ValueError, match="no recorded file"):
        bench.provenance(None)


def test_gpu_slug():
    assert bench.gpu_slug("NVIDIA H200") == "h200"
    assert bench.gpu_slug("Tesla T4") == "tesla-t4"
    assert bench.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100-sxm4-80gb"
    assert bench.gpu_slug() == "cpu"


@pytest.mark.parametrize("gpu, gbps, tflops", [
    ("Tesla T4", 320, 65), ("NVIDIA A100-SXM4-40GB", 1555, 312), ("NVIDIA A100-SXM4-80GB", 2039, 312),
    ("NVIDIA H100 SXM5 80GB", 3350, 989), ("NVIDIA H100 PCIe", 2000, 756), ("NVIDIA H200 NVL", 4800, 835)])
def test_ceilings_from_the_datasheet(gpu, gbps, tflops):
    c = bench.ceilings(gpu)
    assert (c["hbm_copy_gbps"], c["hbm_read_gbps"], c["bf16_tflops"]) == (gbps, gbps, tflops)
    assert "datasheet" in c["source"] and "measured" not in c["source"]


def test_ceilings_prefer_the_measured_file():
    c = bench.ceilings("h200")
    doc = bench.load("ceilings", gpu="h200")
    by = {r["ceiling"]: r for r in doc["rows"]}
    assert c["hbm_copy_gbps"] == by["hbm_copy"]["GBps"]
    assert c["bf16_tflops"] == by["bfloat16_matmul"]["TFLOPs"]
    assert "measured" in c["source"] and "Recorded on" in c["source"]
    if "hbm_read" in by:
        assert c["hbm_read_gbps"] == by["hbm_read"]["GBps"]
    else:
        assert c["hbm_read_gbps"] == 4800.0 and "hbm_read_gbps from the NVIDIA H200" in c["source"]


def test_ceilings_refuse_unknown_gpus_and_no_gpu():
    with pytest.raises(ValueError, match="no measured ceilings and no datasheet entry"):
        bench.ceilings("Radeon 9000")
    with pytest.raises(ValueError, match="name the GPU"):
        bench.ceilings()


def test_ceilings_measure_needs_cuda():
    with pytest.raises(SystemExit, match="CUDA"):
        peaks.measure()


def test_time_ms_graph_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        bench.time_ms(lambda: None, graph=True)


def test_cli_parses_common_options_for_every_suite():
    suite, common, rest = core.parse(["kernels", "--shapes", "tiny", "--out", "results", "--tokens", "1,2"])
    assert (suite, common.out, common.allow_dirty, rest) == ("kernels", "results", False, ["--shapes", "tiny",
                                                                                           "--tokens", "1,2"])
    suite, common, rest = core.parse(["parallel", "--allow-dirty", "--out-dir", "x"])
    assert (suite, common.out, common.allow_dirty, rest) == ("parallel", None, True, ["--out-dir", "x"])
    with pytest.raises(SystemExit):
        core.parse(["nosuch"])
    with pytest.raises(SystemExit):
        core.parse([])


def test_cli_out_reaches_save(tmp_path, monkeypatch, commit):
    import sys
    import types

    seen = {}
    fake = types.ModuleType("fake_suite")
    fake.main = lambda argv: seen.update(argv=argv, path=bench.save("fake", [{"x": 1}]))
    monkeypatch.setitem(sys.modules, "fake_suite", fake)
    monkeypatch.setitem(core.SUITES, "fake", "fake_suite")
    core.main(["fake", "--out", str(tmp_path), "--flag"])
    assert seen["argv"] == ["--flag"] and seen["path"] == tmp_path / "cpu" / "fake.json"


def test_command_line_drops_out():
    cmd = results.command_line(["prog.py", "kernels", "--out", "results", "--quick", "--out=x"])
    assert "--out" not in cmd and "results" not in cmd and cmd.endswith("kernels --quick")


@pytest.mark.gpu
def test_time_ms_graph_replays_the_captured_work():
    import torch

    counter = torch.zeros((), device="cuda")
    t = bench.time_ms(lambda: counter.add_(1), graph=True, warmup=2, rep=5)
    assert t["samples"] >= 1 and 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]
    assert counter.item() >= t["samples"] + 1, "replays of the graph ran the captured add"


@pytest.mark.gpu
def test_ceilings_measure_small_on_a_gpu():
    rows = peaks.measure(copy_bytes=1 << 26, read_bytes=1 << 26, n=1024)
    assert [r["ceiling"] for r in rows][:2] == ["hbm_copy", "hbm_read"] and rows[2]["ceiling"].endswith("_matmul")
    assert rows[0]["bytes"] == 2 << 26 and rows[1]["bytes"] == 1 << 26
    assert all(r.get("GBps", r.get("TFLOPs")) > 0 for r in rows)
    c = bench.ceilings()  # the GPU here: measured file or datasheet, never an error for a known GPU
    assert set(c) == {"hbm_copy_gbps", "hbm_read_gbps", "bf16_tflops", "source"}


def _rows(shapes, tokens, ms):
    return [{"shape": s, "tokens": t, "median_ms": ms} for s in shapes for t in tokens]


def test_save_merge_keeps_the_sizes_this_run_did_not_measure(tmp_path, monkeypatch, commit):
    out = tmp_path / "r"
    bench.save("kernels", _rows(["a", "b"], [1, 8, 4096], 1.0), out=out, command="old", extra={"ceilings": {"r": 1}})
    old = json.loads((out / "cpu" / "kernels.json").read_text())
    monkeypatch.setenv("DISPATCH_GIT_COMMIT", "f" * 40)
    path = bench.save("kernels", _rows(["a"], [1, 8], 2.0), out=out, command="cut", extra={"ceilings": {"r": 1}},
                      merge=True)  # a run cut after shape a
    doc = json.loads(path.read_text())
    by = {(r["shape"], r["tokens"]): r["median_ms"] for r in doc["rows"]}
    assert by == {("a", 1): 2.0, ("a", 8): 2.0, ("b", 1): 1.0, ("b", 8): 1.0, ("a", 4096): 1.0, ("b", 4096): 1.0}
    assert [p["git_commit"] for p in doc["parts"]] == ["f" * 40, GOOD] and doc["git_commit"] == "f" * 40
    assert sorted(map(tuple, doc["parts"][1]["sizes"])) == [("a", 4096), ("b", 1), ("b", 8), ("b", 4096)]
    text = " ".join(bench.provenance(doc).split())
    assert "in 2 runs: T = 1, 8 for a on" in text and "T = 1, 8, 4096 on" in text and old["date"][:10] in text
    # the same run saving again after its next shape: its own earlier part is replaced, not repeated
    path = bench.save("kernels", _rows(["a", "b"], [1, 8], 2.0), out=out, command="full", extra={"ceilings": {"r": 1}},
                      merge=True)
    doc = json.loads(path.read_text())
    assert [p["command"] for p in doc["parts"]] == ["full", "old"] and len(doc["rows"]) == 6
    assert [list(s) for s in doc["parts"][1]["sizes"]] == [["a", 4096], ["b", 4096]]
    assert "T = 1, 8 on" in " ".join(bench.provenance(doc).split())


def test_merge_refuses_other_ceilings_or_software_and_is_plain_without_a_file(tmp_path, commit):
    out = tmp_path / "r"
    path = bench.save("kernels", _rows(["a"], [1], 1.0), out=out, extra={"ceilings": {"r": 1}}, merge=True)
    assert "parts" not in json.loads(path.read_text())  # nothing recorded before: a plain file
    with pytest.raises(ValueError, match="its ceilings is .* record every size again"):
        bench.save("kernels", _rows(["a"], [8], 1.0), out=out, extra={"ceilings": {"r": 2}}, merge=True)
    old = json.loads(path.read_text())
    with pytest.raises(ValueError, match="its versions"):
        results.merged({**old, "versions": {**old["versions"], "torch": "other"}}, old)
    assert results.merged(old, old) == old  # every size re-measured: nothing of the old file is left
