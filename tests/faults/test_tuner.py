"""python -m dispatch.tune: an --out that cannot be written, or that is not a table, is refused before
any tuning; a run saves after every preset, so a failure later keeps what was tuned."""
import json

import pytest
import torch

from dispatch import tune


def test_unwritable_out_is_refused_before_tuning(tmp_path):
    """Was: found only when the first preset's minutes of tuning were saved (and lost)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(SystemExit, match=r"--out: cannot write .*a-file/t.json: .*a-file is a file, not a folder"):
        tune.main(["--preset", "tiny", "--out", str(blocker / "t.json")])
    with pytest.raises(SystemExit, match="is a folder"):
        tune.main(["--preset", "tiny", "--out", str(tmp_path)])


def test_out_that_is_not_a_table_is_refused_before_tuning(tmp_path):
    """Was: a raw JSONDecodeError (after the CUDA check)."""
    bad = tmp_path / "t.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match="is not a tile table"):
        tune.main(["--preset", "tiny", "--out", str(bad)])
    assert bad.read_text() == "{not json"


def test_tokens_must_be_numbers():
    """Was: a raw int() traceback."""
    with pytest.raises(SystemExit) as e:
        tune.main(["--preset", "tiny", "--tokens", "1,abc"])
    assert e.value.code == 2


def test_saves_after_every_preset(tmp_path, monkeypatch, capsys):
    """The second preset fails: the first one's entries are on disk."""
    out = tmp_path / "t.json"
    calls = []

    def tune_preset(preset, tokens, dev, dtype, log, schemes, routing="uniform"):
        calls.append(preset)
        if len(calls) == 2:
            raise RuntimeError("the GPU fell off the bus")
        return {f"key-{preset}": {"buckets": {"1": {"decode_us": 1.0}}}}
    monkeypatch.setattr(tune.runtime, "HAS_CUDA", True)
    monkeypatch.setattr(tune.runtime, "compute_dtype", lambda: torch.float32)
    monkeypatch.setattr(tune.runtime, "device_name", lambda dev: "Fake GPU")
    monkeypatch.setattr(tune, "compile_jobs", lambda *a: [])
    monkeypatch.setattr(tune, "workers_that_fit", lambda jobs, w, free: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (0, 0))
    monkeypatch.setattr(tune, "tune_preset", tune_preset)
    with pytest.raises(RuntimeError, match="fell off"):
        tune.main(["--preset", "tiny,olmoe-1b-7b", "--tokens", "1", "--out", str(out), "--workers", "0"])
    assert list(json.loads(out.read_text())["entries"]) == ["key-tiny"]
