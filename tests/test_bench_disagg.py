"""The disaggregation benchmark's small CPU version: both layouts measured with gloo, the model's
prediction beside each row, the file written under <out>/cpux2/."""
import json

from dispatch_book.bench import disagg, results
from dispatch_book.bench.core import main


def test_cpu_run_writes_both_layouts_with_the_prediction(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "_cli", {"out": None, "allow_dirty": False})  # main's options end with the test
    main(["disagg", "--out", str(tmp_path), "--allow-dirty", "--rates", "8", "--n", "3", "--output", "3"])
    doc = json.loads((tmp_path / "cpux2" / "disagg.json").read_text())
    assert doc["benchmark"] == "disagg" and doc["settings"]["rates"] == [8.0]
    curves = {r["kind"]: r for r in doc["rows"] if r["part"] == "curve"}
    assert set(curves) == {"prefill", "decode"} and all(s > 0 for r in curves.values() for s in r["seconds"])
    rows = [r for r in doc["rows"] if r["part"] == "layout"]
    assert sorted((r["layout"], r["mix"]) for r in rows) == sorted(
        (lay, m) for lay in ("colocated", "disaggregated") for m in ("short", "long"))
    for r in rows:
        assert r["ttft_p50"] > 0 and r["tpot_p50"] > 0 and r["model_ttft_p50"] > 0 and r["model_tpot_p99"] > 0
    dis = [r for r in rows if r["layout"] == "disaggregated"]
    assert all(r["backend"] == "gloo" and r["handoff_bytes_p50"] > 0 and r["handoff_gbps_p50"] > 0 for r in dis)
    assert len(disagg.prediction(doc)) == 2 * 2  # the chapter's reading: layouts x mixes at the one rate
