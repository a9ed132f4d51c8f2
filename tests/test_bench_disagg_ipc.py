"""The CUDA IPC handoff benchmark's CPU dry run: its arguments, a spawned decode side copying out of the
shared-memory pool, every copy exact, the file written row by row under <out>/cpu/."""
import json

import pytest

from dispatch_book.bench import disagg_ipc, harness, results, sets
from dispatch_book.bench.core import main


def test_arguments_and_settings():
    a = disagg_ipc.parse(["--tokens", "16,48", "--reps", "2", "--no-serve"])
    s = disagg_ipc.settings(a)
    assert s["tokens"] == (16, 48) and s["reps"] == 2 and a.no_serve
    assert disagg_ipc.GPU["tokens"] == (1024, 4096) and disagg_ipc.GPU["dtype"] == "bfloat16"
    with pytest.raises(SystemExit):
        disagg_ipc.parse(["--tokens", "x"])
    assert "dispatch/serve/handoff_ipc.py" in sets.measured_paths("disagg_ipc")


def test_cpu_dry_run_writes_the_ceiling_and_the_handoff_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_cli", {"out": None, "allow_dirty": False})  # main's options end with the test
    fake = {"median_ms": 0.5, "min_ms": 0.4, "max_ms": 0.6, "samples": 3}
    monkeypatch.setattr(harness, "time_ms", lambda fn, **_: (fn(), fake)[1])  # a fake ceiling: 0.5 ms a copy
    main(["disagg_ipc", "--out", str(tmp_path), "--allow-dirty", "--tokens", "16,48", "--reps", "2"])
    doc = json.loads((tmp_path / "cpu" / "disagg_ipc.json").read_text())
    assert doc["benchmark"] == "disagg_ipc" and doc["settings"]["tokens"] == [16, 48]
    rows, tiles = doc["rows"][:4], doc["rows"][4:]
    assert [(r["part"], r["tokens"]) for r in rows] == [("copy", 16), ("handoff", 16), ("copy", 48), ("handoff", 48)]
    # the copy kernel's launch shapes (the first two on a CPU), per prompt length
    assert [(r["part"], r["tokens"], r["tile"], r["num_warps"]) for r in tiles] == [
        ("tile", n, t, w) for n in (16, 48) for t, w in disagg_ipc.TILES[:2]]
    size = {r["tokens"]: r["bytes"] for r in rows if r["part"] == "copy"}
    assert all(r["gbps"] == size[r["tokens"]] / 0.5e6 for r in tiles)  # the same blocks, the fake 0.5 ms
    kvb = 2 * 2 * 2 * 16 * 4  # CPU: layers x K,V x heads x head_dim x fp32 bytes, per token
    for copy, h in (rows[:2], rows[2:]):
        assert copy["bytes"] == h["bytes"] == h["blocks"] * 16 * kvb and copy["gbps"] == copy["bytes"] / 0.5e6
        assert h["exact"] and h["reps"] == 2 and 0 < h["copy_ms_min"] <= h["copy_ms_p50"] <= h["handoff_ms_max"]
        assert h["of_ceiling"] == pytest.approx(0.5 / h["copy_ms_p50"]) and h["gbps"] > 0
