"""The expert-parallel benchmark's code path on 2 CPU ranks (gloo): its rows, its bit-for-bit checks,
and no file written without --out."""
import parallel_ranks as PR

from dispatch.parallel import launch


def test_benchmark_rows_on_cpu_ranks(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = launch(PR.bench_rows, 2, ["--tokens", "2", "--reps", "1"], timeout_s=240)[0]
    got = {(r["kind"], r.get("contestant")) for r in rows}
    assert {("exchange", "gloo_all_to_all"), ("exchange", "gloo_dispatch_combine"), ("layer", "ep_gloo"),
            ("layer", "one_gpu"), ("layer", "one_gpu_auto"), ("memory", None)} <= got
    assert all(r["bitwise_equal"] for r in rows if "bitwise_equal" in r)
    mem = next(r for r in rows if r["kind"] == "memory")
    assert mem["expert_weights_gib_per_gpu_ep"] * 2 == mem["expert_weights_gib_one_gpu"]
    assert not list(tmp_path.iterdir())  # nothing saved unless asked
