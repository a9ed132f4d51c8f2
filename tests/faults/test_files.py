"""Every file the package writes is written whole or not at all: a write cut short (disk full, an
exception) leaves the file that was there as it was, and no temporary file behind."""
import json
import pathlib

import pytest

from dispatch import config, quant, tables


def _cut_short(monkeypatch):
    """Writes through Path.write_text / write_bytes put half their data down, then the disk is full."""
    real_text, real_bytes = pathlib.Path.write_text, pathlib.Path.write_bytes

    def half_text(self, data, *a, **k):
        real_text(self, data[: len(data) // 2], *a, **k)
        raise OSError(28, "No space left on device")

    def half_bytes(self, data):
        real_bytes(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(pathlib.Path, "write_text", half_text)
    monkeypatch.setattr(pathlib.Path, "write_bytes", half_bytes)


def test_tables_write_cut_short_keeps_the_table(tmp_path, monkeypatch):
    """Was: tables.write truncated the table, then wrote in place: a full disk destroyed it."""
    path = tmp_path / "h200.json"
    old = {"device": "x", "entries": {"E=8,H=64,I=32,K=2,float32": {"buckets": {"1": {"decode_us": 1.0}}}}}
    tables.write(path, old)
    before = path.read_bytes()
    _cut_short(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        tables.write(path, {**old, "more": "x" * 10000})
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h200.json"]


def test_replacing_keeps_the_old_file_on_any_failure_and_the_folder_clean(tmp_path):
    from dispatch import files

    path = tmp_path / "f.bin"
    files.write_bytes(path, b"old")
    with pytest.raises(KeyboardInterrupt), files.replacing(path) as tmp:
        tmp.write_bytes(b"ne")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]
    files.write_text(path, "new")
    assert path.read_text() == "new"
    with pytest.raises(IsADirectoryError, match="is a folder"):
        files.write_text(tmp_path, "x")


def test_quant_save_cut_short_keeps_the_file(tmp_path, monkeypatch):
    """Was: safetensors wrote straight into the target."""
    w = config.random_weights(config.PRESETS["tiny"])
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "int8-channel")
    path = quant.save(tmp_path / "q.safetensors", qe)
    before = path.read_bytes()
    import safetensors.torch

    def dies(tensors, filename, metadata=None):
        pathlib.Path(filename).write_bytes(b"\0" * 100)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(safetensors.torch, "save_file", dies)
    with pytest.raises(OSError, match="No space left"):
        quant.save(path, qe)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["q.safetensors"]


def test_results_and_notebooks_go_through_the_one_writer(tmp_path, monkeypatch):
    """results.save and a chapter's refreshed notebook are replaced whole (dispatch.files)."""
    from dispatch_book.bench import results

    monkeypatch.setenv("DISPATCH_GIT_COMMIT", "0" * 40)
    monkeypatch.setattr(results, "checked_commit", lambda allow_dirty=False, cwd=None: "0" * 40)
    path = results.save("faults_demo", [{"a": 1}], out=tmp_path)
    before = path.read_bytes()
    _cut_short(monkeypatch)
    with pytest.raises(OSError, match="No space left"):
        results.save("faults_demo", [{"a": 2}], out=tmp_path)
    assert path.read_bytes() == before
    assert json.loads(before)["rows"] == [{"a": 1}]


def test_tokenizer_cache_is_written_whole(tmp_path, monkeypatch):
    from dispatch import data

    monkeypatch.setenv("DISPATCH_CACHE", str(tmp_path))

    class Tok:
        def save(self, p):
            pathlib.Path(p).write_text('{"half":')
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(data, "train_tokenizer", lambda v, root=None: Tok())
    monkeypatch.setattr(data, "manifest", lambda root=None: {"hash": "h"})
    with pytest.raises(OSError):
        data.tokenizer(300)
    assert list(tmp_path.iterdir()) == []
