"""The GPU part of the speculative suite, run on a CPU with its timings stubbed and small sizes: every
row kind is produced with the fields the chapter's summary reads (the GPU run itself is not testable
here; this catches its bookkeeping)."""
import pytest
import torch

from dispatch.engine import LeanModel
from dispatch.hf import tiny_model
from dispatch_book.bench import spec_record
from dispatch_book.spec_study import gpu_summary


@pytest.fixture
def small(monkeypatch):
    """K_MAX 2, 6 tokens, one-call timings, the default mode for 'invariant' (no interpreter)."""
    from dispatch_book import bench

    monkeypatch.setattr(spec_record, "K_MAX", 2)
    monkeypatch.setattr(spec_record, "NEW", 6)
    monkeypatch.setattr(bench, "time_ms", lambda fn, **kw: (fn(), {"median_ms": 1.0, "min_ms": 1.0})[1])
    plain = LeanModel.from_hf.__func__
    monkeypatch.setattr(LeanModel, "from_hf", classmethod(lambda cls, m, **kw: plain(
        cls, m, **{k: v for k, v in kw.items() if k != "batch_invariant"})))
    tiny = tiny_model("olmoe", vocab_size=4096)[1]
    monkeypatch.setattr(spec_record, "build_preset", lambda name, layers=None: tiny)


def test_every_row_kind(small):
    from dispatch.train import load

    tr = spec_record.traces_recording()
    rows_in = tr["rows"][:2]
    prompts = [r["prompt"] for r in rows_in]
    conts = [r["continuation"][:6] for r in rows_in]
    runs = {"lookup": [r["runs_lookup"][:6] for r in rows_in], "draft": [r["runs_draft"][:6] for r in rows_in]}
    rows = []

    def add(row):
        rows.append({"shape": row.pop("model"), **row})

    torch.set_num_threads(1)
    spec_record._shipped(load("cpu"), load("draft"), prompts, runs, add, lambda: 1e9)
    spec_record._preset("mixtral-8x7b", None, prompts, conts, runs, add, lambda: 1e9)
    kinds = {r["kind"] for r in rows}
    assert kinds == {"verify_cost", "race", "peer", "replay"}
    race = [r for r in rows if r["kind"] == "race" and r["drafter"] != "none"]
    assert race and all(r["identical_to_plain_greedy"] == 2 for r in race)  # the same mode: same tokens
    replay = [r for r in rows if r["kind"] == "replay" and r["drafter"] != "none"]
    assert {r["drafter"] for r in replay} == {"lookup", "draft"} and all("replayed" in r for r in replay)
    assert all(r["layers"] and r["of_layers"] == 32 for r in rows if r["shape"] == "mixtral-8x7b")
    s = gpu_summary({"rows": rows})
    assert len(s["race"]) == len(race) + 2 + 4 and len(s["replay"]) == 6


def test_gpu_sentences_by_hand():
    """The chapter's sentences about a recording, from rows whose ratios are known by hand."""
    from dispatch_book.spec_study import gpu_sentences

    rows = [{"kind": "race", "shape": "shipped", "mode": "default", "drafter": "none", "k": 0, "tok_s": 10000.0},
            {"kind": "race", "shape": "shipped", "mode": "invariant", "drafter": "lookup", "k": "4", "tok_s": 8000.0,
             "tokens_per_step": 2.0},
            {"kind": "race", "shape": "shipped", "mode": "invariant", "drafter": "lookup", "k": "8", "tok_s": 5000.0,
             "tokens_per_step": 2.5},
            {"kind": "peer", "shape": "shipped", "contestant": "plain", "tok_s": 100.0},
            {"kind": "peer", "shape": "shipped", "contestant": "prompt_lookup_4", "tok_s": 150.0},
            {"kind": "invariance", "shape": "olmoe-1b-7b", "batch": 1, "mode": "invariant", "median_ms": 2.0},
            {"kind": "verify_cost", "shape": "olmoe-1b-7b", "mode": "invariant", "drafter": "lookup", "k": 0,
             "median_ms": 2.5},
            {"kind": "replay", "shape": "olmoe-1b-7b", "mode": "invariant", "drafter": "lookup", "k": "7",
             "speedup_vs_invariant_plain": 1.7, "speedup_vs_default_plain": 1.1},
            {"kind": "replay", "shape": "olmoe-1b-7b", "mode": "invariant", "drafter": "draft", "k": "3",
             "skipped": "time budget"}]
    s = gpu_sentences({"rows": rows})
    assert s[0] == ("shipped model, batch 1: plain decoding 100 µs a token; prompt lookup (k=4) keeps 2.00 tokens "
                    "a step at 250 µs a step: 0.80x plain")
    assert s[1] == "transformers' generate: prompt_lookup_4 1.50x its plain generate (100 tok/s)"
    assert s[2] == "olmoe-1b-7b: a speculative step at k=0 costs 2.500 ms, 1.25x the invariant decode step (2.000 ms)"
    assert s[3] == "olmoe-1b-7b replay, lookup k=7: 1.70x the invariant plain decode, 1.10x the default one"
    assert len(s) == 4  # the skipped row says nothing
    merged = {"rows": rows, "git_commit": "new", "parts": [  # the step cost from another run than the step
        {"git_commit": "new", "sizes": [["olmoe-1b-7b", None, "kind", "invariance"]]},
        {"git_commit": "old", "sizes": [["olmoe-1b-7b", None, "kind", "verify_cost"]]}]}
    assert not any("k=0 costs" in line for line in gpu_sentences(merged))


def test_run_each_warms_up_on_the_whole_set_and_keeps_the_median_pass():
    """With passes > 1 every prompt runs once untimed (an adaptive k's graphs are captured then), and of
    the timed passes the one of median decode time is returned."""
    from types import SimpleNamespace

    from dispatch_book.bench.speculative import run_each

    class Fake:
        def __init__(self):
            self.calls, self.times = [], iter([9.0, 9.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0])

        def generate(self, prompts, new):
            self.calls.append((tuple(prompts[0]), new))
            return SimpleNamespace(decode_s=next(self.times))

    eng = Fake()
    outs = run_each(eng, [[1], [2]], 5, passes=3)
    assert eng.calls == [((1,), 5), ((2,), 5)] * 4  # the warm-up pass, then three timed passes
    assert [o.decode_s for o in outs] == [2.0, 2.0]  # totals 6, 2, 4: the median is 4
