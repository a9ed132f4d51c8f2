"""The expert-parallel benchmark's code path on 2 CPU ranks (gloo): its rows, its bit-for-bit checks,
and its results file where --out says."""
import json

import parallel_ranks as PR

from dispatch.parallel import launch


def test_benchmark_rows_on_cpu_ranks(tmp_path):
    argv = ["--tokens", "2", "--reps", "1", "--out", str(tmp_path), "--allow-dirty"]
    rows = launch(PR.bench_rows, 2, argv, timeout_s=240)[0]
    got = {(r["kind"], r.get("contestant")) for r in rows}
    assert {("exchange", "gloo_all_to_all"), ("exchange", "gloo_dispatch_combine"), ("layer", "ep_gloo"),
            ("layer", "one_gpu"), ("layer", "one_gpu_auto"), ("memory", None)} <= got
    assert all(r["bitwise_equal"] for r in rows if "bitwise_equal" in r)
    mem = next(r for r in rows if r["kind"] == "memory")
    assert mem["expert_weights_gib_per_gpu_ep"] * 2 == mem["expert_weights_gib_one_gpu"]
    doc = json.loads((tmp_path / "cpu" / "expert_parallel.json").read_text())
    assert doc["rows"] == rows and doc["world_size"] == 2
    assert doc["command"].startswith("torchrun --nproc_per_node 2 -m dispatch_book.bench.parallel")
