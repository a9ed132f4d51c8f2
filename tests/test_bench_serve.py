"""The serving benchmark: its statistics on hand-made records, and the whole suite on a CPU with a
tiny workload (every part, each contestant measured or recorded with the reason it did not run)."""
import json
import math
import os
import sys
import time

import pytest

from dispatch_book.bench import serve_load, serve_online
from dispatch_book.bench.serve_load import Record


def rec(sent, pieces, tokens=None, status=200, error=None):
    return Record(sent=sent, pieces=pieces, tokens=tokens or len(pieces), status=status, error=error)


def test_summary_by_hand():
    recs = [rec(0.0, [0.1, 0.2, 0.3]),  # TTFT 100 ms, TPOT 100 ms
            rec(1.0, [1.5, 1.51, 1.52, 1.53]),  # TTFT 500 ms, TPOT 10 ms
            rec(2.0, [], status=429, error="full")]
    s = serve_load.summary(recs, 4.0, slo_ttft_s=0.6, slo_tpot_s=0.05)
    assert (s["requests"], s["completed"], s["failed"], s["output_tokens"]) == (3, 2, 1, 7)
    assert s["output_tok_s"] == 7 / 4.0
    assert s["ttft_ms"]["p50"] == pytest.approx(300.0) and s["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert s["tpot_ms"]["p99"] == pytest.approx(100 - 0.01 * 90, rel=1e-6)  # numpy's linear interpolation
    assert s["itl_ms"]["mean"] == pytest.approx((0.1 + 0.1 + 0.01 * 3) / 5 * 1e3)
    assert s["goodput_req_s"] == 1 / 4.0 and s["goodput_share"] == pytest.approx(1 / 3)  # only the second meets both


def test_workload_and_arrivals_are_seeded():
    a = serve_load.workload(20, (3, 9), (1, 4), vocab=50, seed=3)
    assert a == serve_load.workload(20, (3, 9), (1, 4), vocab=50, seed=3)
    assert all(3 <= len(r.prompt) <= 9 and 1 <= r.max_tokens <= 4 and all(2 <= t < 50 for t in r.prompt) for r in a)
    t = serve_load.arrivals(2000, rate=10.0, seed=1)
    assert t == sorted(t) and abs(len(t) / t[-1] - 10.0) < 1.0  # a Poisson process at 10 req/s
    assert serve_load.arrivals(3, math.inf) == [0.0, 0.0, 0.0]


def test_first_difference_reports_the_margin():
    a = Record(text="a b c", token_texts=["a", " b", " c"], margins=[2.0, 0.5, 1.0])
    b = Record(text="a b d", token_texts=["a", " b", " d"], margins=[2.0, 0.5, 1e-6])
    assert serve_load.first_difference(a, a) is None
    assert serve_load.first_difference(a, b) == {"token": 2, "margin_alone": 1e-6}
    short = Record(text="a", token_texts=["a"], margins=[2.0])
    assert serve_load.first_difference(a, short) == {"token": 1, "margin_alone": None}


def test_max_rate_within():
    rows = [{"rate": 2, "tpot_ms": {"p99": 20}}, {"rate": 4, "tpot_ms": {"p99": 45}},
            {"rate": 8, "tpot_ms": {"p99": 70}}, {"rate": 16, "skipped": "budget"}]
    assert serve_online.max_rate_within(rows, 50) == 4 and serve_online.max_rate_within(rows, 10) is None


def test_word_tokenizer_round_trips():
    from dispatch_book.bench.serve_peers import as_text, word_tokenizer

    tok = word_tokenizer(300)
    ids = [0, 1, 17, 170, 299, 12]
    assert tok(as_text(ids))["input_ids"] == ids and tok.decode(ids) == as_text(ids)


@pytest.mark.slow
def test_suite_on_cpu(tmp_path):
    pytest.importorskip("aiohttp")
    from dispatch_book.bench import configure
    from dispatch_book.bench import serve as suite

    configure(out=tmp_path, allow_dirty=True)
    try:
        suite.main(["--parts", "step,offline,online,reliability", "--contestants", "ours,static,hf_cb,hf_serve",
                    "--offline-n", "6", "--online-n", "4", "--rates", "8", "--reliability-n", "30",
                    "--step-batches", "2", "--budget-s", "300"])
    finally:
        configure()
    doc = json.loads((tmp_path / "cpu" / "serve.json").read_text())
    rows = doc["rows"]
    by = {(r["part"], r.get("contestant")): r for r in rows}
    assert by[("step", None)]["static_ms"] > 0 and by[("step", None)]["engine_step_ms"] > 0
    for name in ("ours", "static", "hf_cb"):
        r = by[("offline", name)]
        assert r.get("did_not_run") or r["output_tokens"] == sum(q.max_tokens for q in serve_load.workload(
            6, (4, 40), (4, 40), 4096, 0))
    assert by[("offline", "ours")]["output_tok_s"] > 0
    assert by[("online", "ours")]["completed"] == 4
    assert "did_not_run" in by[("online", "hf_serve")] or by[("online", "hf_serve")]["completed"] == 4
    rel = by[("reliability", "ours")]
    assert rel["blocks_held_after"] == 0 and not rel["problems"] and not rel["differ_alone"]
    assert not any(int(s) >= 500 for s in rel["statuses"])


def test_a_second_call_merges_by_part():
    """A recording made in two GPU calls at two commits: the second call's parts replace the first's
    rows of those parts only, and each run's commit stays named (provenance, staleness)."""
    from dispatch_book.bench import results

    def doc(commit, rows):
        return {"benchmark": "serve", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
                "versions": {"torch": "2.11", "triton": "3.6", "transformers": "5.17"},
                "git_commit": commit, "date": f"2026-12-0{commit[0]}T00:00:00+00:00", "command": f"run {commit[0]}",
                "rows": rows}

    old = doc("5" * 40, [{"part": "step", "batch": 1}, {"part": "offline", "contestant": "ours"},
                         {"part": "online", "contestant": "ours", "rate": 4}])
    new = doc("7" * 40, [{"part": "online", "contestant": "hf_serve", "rate": 4},
                         {"part": "reliability", "contestant": "ours"}])
    got = results.merged(new, old)
    assert [(r["part"], r.get("contestant")) for r in got["rows"]] == [
        ("online", "hf_serve"), ("reliability", "ours"), ("step", None), ("offline", "ours")]  # old online: replaced
    assert [(p["git_commit"][0], sorted(s[0] for s in p["sizes"])) for p in got["parts"]] == [
        ("7", ["online", "reliability"]), ("5", ["offline", "step"])]
    text = results.provenance(got).replace("\n", " ")
    assert "in 2 runs: online, reliability on 2026-12-07 at commit 7777" in text
    assert "offline, step on 2026-12-05 at commit 5555" in text


def test_unfinished_bounds_the_throughput():
    """A run cut off after 20 s with 3,000 tokens asked for could not have run faster than 150 tokens/s."""
    from dispatch_book.bench.serve_peers import Unfinished

    e = Unfinished(done=5, requests=8, tokens=1200, total=3000, wall_s=20.0)
    assert isinstance(e, TimeoutError) and "5 of 8 requests done after 20 s" in str(e)
    b = e.bound()
    assert b["output_tok_s_at_most"] == 150.0 and b["requests_done"] == 5 and "output_tok_s" not in b


def test_live_run_is_bounded():
    """Chapter 8's live run on a machine without a recording ends within its budget: what overran is a row
    that says so (with every thread's stack), not a hang; transformers' run alone is bounded too."""
    pytest.importorskip("aiohttp")
    import time

    from dispatch.train import load
    from dispatch_book.bench import serve_live, serve_peers

    ck = load("cpu")
    reqs = serve_load.workload(3, (4, 8), (4, 8), ck.model.config.vocab_size, 0)
    with pytest.raises(TimeoutError, match="(after|within) 0 s"):
        serve_peers.hf_cb(ck.model, reqs, warmup=False, timeout_s=1e-3, cache_tokens=1024)
    t0 = time.perf_counter()
    rows = serve_live.live(ck, n=3, prompt=(4, 8), output=(4, 8), rates=(64.0,), budget_s=1e-3)
    assert time.perf_counter() - t0 < 120
    by = {(r["part"], r["contestant"]): r for r in rows}
    ours = by[("offline", "ours")]
    assert ours["output_tokens"] == sum(r.max_tokens for r in reqs)
    where = ours["where"]  # every step counted once, in one of the two kinds; every prompt token prefilled
    assert where["decode"]["steps"] + where["mixed"]["steps"] == ours["steps"]
    assert where["mixed"]["prefill_tokens"] == sum(len(r.prompt) for r in reqs)
    assert 0 < where["decode"]["s"] + where["mixed"]["s"] <= ours["wall_s"]
    # a decode row attends to its whole sequence so far: at least its prompt and one token
    assert where["decode"]["kv_tokens"] >= where["decode"]["rows"] * (min(len(r.prompt) for r in reqs) + 1)
    hf = by[("offline", "hf_cb")]
    assert "MainThread" in hf["stacks"]
    if "did_not_finish" in hf:  # cut off mid-run: its throughput bound, from every token it was asked for
        assert hf["output_tok_s_at_most"] == pytest.approx(sum(r.max_tokens for r in reqs) / hf["wall_s"])
    else:
        assert hf["did_not_run"].startswith("TimeoutError")
    online = by[("online", "ours")]  # a second per request at least: 3 tiny requests finish in it
    assert online.get("completed") == 3 or "budget" in online["did_not_run"]


def test_serve_summary_sentences():
    """The chapter's sentences come from the rows: ratios (a cut-off peer as a lower bound), who is ahead
    at each rate, the highest rate within the TPOT objective, the paged step against the static one."""
    from dispatch_book.bench import serve_summary as ss

    def online(name, rate, ttft, tpot):
        return {"part": "online", "contestant": name, "rate": rate, "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
                "tpot_ms": {"p50": tpot, "p99": 2 * tpot}}

    rows = [{"part": "offline", "contestant": "ours", "output_tok_s": 1000.0},
            {"part": "offline", "contestant": "static", "output_tok_s": 400.0},
            {"part": "offline", "contestant": "hf_cb", "output_tok_s_at_most": 250.0, "requests_done": 3},
            {"part": "offline", "contestant": "hf_cb_dispatch", "did_not_run": "TimeoutError: warm-up"},
            online("ours", 4, 10, 20), online("ours", 8, 60, 30), online("hf_serve", 4, 20, 30),
            online("hf_serve", 8, 50, 40), {"part": "online", "contestant": "url", "did_not_run": "no answer in 180 s"},
            {"part": "step", "batch": 1, "context": 512, "rows_held": 1, "paged_over_static": 1.05},
            {"part": "step", "batch": 64, "context": 512, "rows_held": 64, "paged_over_static": 0.98},
            {"part": "step", "batch": 256, "context": 512, "paged_over_static": 0.5}]  # rows not held: left out
    assert ss.offline_ratios(rows) == {"static": (2.5, False), "hf_cb": (4.0, True)}
    table = {r["contestant"]: r for r in ss.offline_table(rows)}
    assert table["hf_cb"]["ours is x faster"] == 4.0 and table["hf_cb"]["note"].startswith("cut off, 3 done")
    dnr = table["hf_cb_dispatch"]
    assert dnr["ours is x faster"] is None and dnr["note"] == "TimeoutError: warm-up"
    s = ss.offline_sentence(rows)
    assert "1,000 output tokens/s" in s and "2.50x the static" in s and "at least 4.00x" in s
    assert "not measured (TimeoutError: warm-up)" in s
    lines = ss.online_sentences(rows)
    assert "rate 4/s" in lines[0] and "TTFT p50 10 vs 20 ms ok" in lines[0] and "TPOT p99 40 vs 60 ms ok" in lines[0]
    assert "TTFT p50 60 vs 50 ms BEHIND" in lines[1] and lines[2] == "url did not run: no answer in 180 s"
    assert lines[-2].endswith("4 requests/s") and lines[-1].endswith("none")  # TPOT p99 40 and 60 ms at 4/s
    assert "0.98-1.05x" in ss.step_sentence(rows) and "batch 1, 64 (" in ss.step_sentence(rows)
    assert "no graphed paged step" in ss.step_sentence(rows[-1:])
    assert ss.offline_sentence(rows[1:]) == "offline: this engine was not measured"
    assert ss.where_sentence(rows) == ""  # no step record: nothing said
    ours_only = [r for r in rows if r.get("contestant") == "ours"]  # the peers absent from a recording are named
    assert ss.offline_sentence(ours_only).count("not in this recording") == 3
    assert "`transformers serve` is not in this recording" in ss.online_sentences(ours_only)
    assert not any("not in this recording" in line for line in ss.online_sentences(rows))
    rows[0].update(wall_s=10.0, kv_bytes_per_token=1000, where={
        "decode": {"steps": 100, "s": 6.0, "rows": 20000, "kv_tokens": 300_000_000, "prefill_tokens": 0},
        "mixed": {"steps": 10, "s": 3.0, "rows": 500, "kv_tokens": 0, "prefill_tokens": 20000}})
    w = ss.where_sentence(rows)  # 3e8 tokens x 1000 B / 100 steps = 3 GB a step; 20000 / 10 prompt tokens
    assert "100 decode-only steps, 6.0 s (60.0 ms each, 200 rows and 3.0 GB" in w
    assert "10 steps with a prompt chunk, 3.0 s (300.0 ms each, 2,000 prompt tokens and 50 decode rows" in w


def test_one_time_stalls():
    """A TTFT tail that falls as the rate rises is named; one that grows with it (a queue) is not."""
    from dispatch_book.bench.serve_summary import one_time_stalls

    def r(ttft99, tpot99):
        return {"ttft_ms": {"p99": ttft99}, "tpot_ms": {"p99": tpot99}}

    said = one_time_stalls("ours", {4: r(400, 10), 8: r(2000, 45), 16: r(2100, 40), 32: r(70, 16), 64: r(140, 18)})
    assert [s.split(" at ")[1].split(" ")[0] for s in said] == ["4/s", "8/s", "16/s"]
    assert said[1] == ("this engine: TTFT p99 2000 ms at 8/s but 70 ms at 32/s (TPOT p99 45 vs 16 ms): "
                       "a tail that falls as the load rises is a one-time stall, not the queue")
    assert one_time_stalls("ours", {4: r(50, 10), 8: r(80, 12), 16: r(400, 30)}) == []


def test_reliability_sentences():
    """Counts by hand: differences at a near tie counted against the stated tolerance, the widest margin
    named; a run that did not happen, or none at all, said so."""
    from dispatch_book.bench.serve_summary import reliability_sentences

    rel = {"part": "reliability", "requests": 1000, "kinds": {"full": 850}, "statuses": {"200": 950, "400": 50},
           "blocks_held_after": 0, "checked_alone": 20,
           "differ_alone": [{"margin_alone": 0.0}, {"margin_alone": 0.03125}, {"margin_alone": 0.5}]}
    said = reliability_sentences([rel])
    assert said[0] == ("reliability: 1,000 requests (850 read to the end); answers 950 × 200, 50 × 400; blocks "
                       "held afterwards 0; 3 of 20 checked answers differ from the prompt's alone")
    assert said[1] == ("2 of the 3 differences start at a near tie (the prompt alone had its two best logits "
                       "within 0.125); the widest margin is 0.5")
    assert len(reliability_sentences([{**rel, "differ_alone": []}])) == 1
    assert reliability_sentences([{"part": "reliability", "did_not_run": "no time"}]) == [
        "reliability: not measured (no time)"]
    assert "no reliability run" in reliability_sentences([])[0]


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_dies_with_the_benchmark_that_started_it():
    """A benchmark killed by its time limit (SIGKILL: no cleanup runs) must not leave its server behind."""
    import signal
    import subprocess

    code = ("import subprocess, sys, time\n"
            "from dispatch_book.bench.serve_online import _die_with_parent\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'],\n"
            "                     preexec_fn=_die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(10)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        with open(f"/proc/{child}/stat") as f:  # a zombie has died already (its parent, init, reaps it)
            if f.read().split(")")[-1].split()[0] == "Z":
                return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its parent by 10 s")


def test_the_peer_runs_without_cudnn_attention(tmp_path):
    """transformers' runs take SDPA without cuDNN (it fails intermittently in their paged SDPA): the server's
    command is transformers' own CLI with that one switch, the in-process runs restore the switch after, and a
    rate whose requests failed names the server's last error."""
    import subprocess

    import torch

    from dispatch_book.bench import serve_online
    from dispatch_book.bench import serve_summary as ss

    cmd = serve_online._command("hf_serve", "FOLDER", 1234, max_seqs=4, max_step_tokens=64)
    assert "enable_cudnn_sdp(False)" in cmd[2] and cmd[3:6] == ["serve", "FOLDER", "--continuous-batching"]
    r = subprocess.run([*cmd[:3], "serve", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Usage: transformers serve" in r.stdout, r.stderr[-400:]
    before = torch.backends.cuda.cudnn_sdp_enabled()
    with serve_online.peer_attention():
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == before
    log = tmp_path / "serve.log"
    log.write_text("INFO: started\nTraceback (most recent call last):\nRuntimeError: Expected mha_graph.execute ok\n"
                   "INFO: 503 Service Unavailable\n")
    assert serve_online.last_error(str(log)) == "RuntimeError: Expected mha_graph.execute ok"
    assert serve_online.last_error(str(tmp_path / "none.log")) is None
    row = {"part": "online", "contestant": "hf_serve", "rate": 8.0, "requests": 64, "failed": 64,
           "ttft_ms": {"p50": None, "p99": None}, "tpot_ms": {"p50": None, "p99": None},
           "server_error": serve_online.last_error(str(log))}
    said = ss.online_sentences([row])
    assert "rate 8/s: `transformers serve` failed 64 of 64 requests: RuntimeError: Expected mha_graph" in said[0]
