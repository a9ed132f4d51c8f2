"""The balancing study: runs every setting once per seed, records the seed, and sums up over seeds."""
import dataclasses
import math
import statistics

import pytest
import torch

from dispatch import train
from dispatch_book import bench
from dispatch_book.bench import balance_study


def fake_log(cfg, ppl, imbalance):
    return {"config": dataclasses.asdict(cfg), "final": {"val_ppl": ppl, "imbalance": imbalance},
            "curves": {"imbalance": [9.0, imbalance + 0.1]}, "train_seconds": 1.0, "manifest_hash": "h"}


def test_run_trains_every_setting_once_per_seed_and_records_the_seed(monkeypatch):
    seen = []

    def fake_run(cfg, out_dir, *, command, progress=True):
        seen.append((cfg.balance, cfg.aux_coef, cfg.seed, cfg.threads, command))
        return fake_log(cfg, 100.0 + cfg.seed, 1.5)

    monkeypatch.setattr(train, "run", fake_run)
    logs = balance_study.run(threads=1, seeds=(4, 7), preset="micro")
    assert set(logs) == {(label, s) for label in balance_study.STUDY for s in (4, 7)}
    assert len(seen) == 8 and {s[3] for s in seen} == {1}
    assert ("aux", 0.1, 7, 1, "python -m dispatch.train --preset micro --balance aux --aux-coef 0.1 "
            "--seed 7 --threads 1") in seen
    rows = balance_study.rows_of(logs)
    assert all(r["seed"] == r["config"]["seed"] for r in rows)
    assert sorted({r["seed"] for r in rows}) == [4, 7]


@pytest.mark.parametrize("seeds", [(), (1, 1)])
def test_run_refuses_missing_or_repeated_seeds(seeds):
    with pytest.raises(ValueError, match="distinct seeds"):
        balance_study.run(seeds=seeds)


def test_summarize_by_hand():
    cfg = train.PRESETS["micro"]
    rows = [{"label": "a", "seed": s, **fake_log(cfg, p, i)}
            for s, p, i in ((2, 120.0, 1.2), (0, 100.0, 1.4), (1, 110.0, 1.0))]
    rows.append({"label": "b", "seed": 0, **fake_log(cfg, 50.0, 3.0)})
    s = balance_study.summarize(rows)
    assert s["a"]["seeds"] == [0, 1, 2] and s["b"]["seeds"] == [0]
    ppl = s["a"]["val_ppl"]
    assert ppl["mean"] == 110.0 and ppl["min"] == 100.0 and ppl["max"] == 120.0 and ppl["std"] == 10.0
    assert ppl["by_seed"] == {0: 100.0, 1: 110.0, 2: 120.0}
    assert s["a"]["val_imbalance"]["by_seed"] == {0: 1.4, 1: 1.0, 2: 1.2}
    assert math.isclose(s["a"]["val_loss"]["mean"], statistics.fmean(map(math.log, (100, 110, 120))))
    assert s["a"]["train_imbalance"]["by_seed"][1] == pytest.approx(1.1)
    assert s["b"]["val_ppl"]["std"] == 0.0  # one seed: no spread
    with pytest.raises(ValueError, match="seed appears twice"):
        balance_study.summarize(rows + rows[:1])


def test_cli_refuses_repeated_seeds():
    with pytest.raises(SystemExit):
        balance_study.main(["--seeds", "0", "0"])


def test_seed_changes_initialisation_and_batch_order():
    cfg = train.PRESETS["micro"]
    a, b = train.build_model(cfg), train.build_model(dataclasses.replace(cfg, seed=1))
    assert not torch.equal(a.model.embed_tokens.weight, b.model.embed_tokens.weight)
    ids = torch.arange(1000)
    first = [next(train.data.batches(ids, 16, 4, seed=s)) for s in (0, 1, 0)]
    assert torch.equal(first[0], first[2]) and not torch.equal(first[0], first[1])


def test_committed_study_has_every_setting_for_the_same_three_or_more_seeds():
    doc = bench.load("balance_study", gpu="cpu")
    rows = doc["rows"]
    seeds = {label: sorted(r["seed"] for r in rows if r["label"] == label) for label in balance_study.STUDY}
    assert len(seeds["none"]) >= 3 and all(v == seeds["none"] for v in seeds.values()), seeds
    assert all(r["seed"] == r["config"]["seed"] for r in rows)
    assert len(rows) == len(balance_study.STUDY) * len(seeds["none"])
    assert not doc["git_commit"].endswith("+dirty")


def test_spread_and_paired_differences_by_hand():
    cfg = train.PRESETS["micro"]
    rows = [{"label": lb, "seed": s, **fake_log(cfg, p, 1.0)}
            for lb, s, p in (("a", 0, 100.0), ("a", 1, 104.0), ("a", 2, 101.0),
                             ("b", 0, 102.0), ("b", 1, 103.0), ("b", 2, 105.0), ("c", 5, 1.0))]
    s = balance_study.summarize(rows)
    assert balance_study.spread(s["a"]["val_ppl"], ".1f") == "101.7 (100.0–104.0)"
    d = balance_study.paired(s, "a", "b", "val_ppl")
    assert d["diffs"] == [-2.0, 1.0, -4.0] and d["mean"] == pytest.approx(-5 / 3)
    assert (d["min"], d["max"]) == (-4.0, 1.0) and not d["same_sign"]
    assert d["noise"] == 4.0  # a spans 100-104, b 102-105
    assert balance_study.paired(s, "b", "a", "val_imbalance")["same_sign"] is False  # all 0
    one_way = balance_study.paired(s, "b", "a", "val_ppl")
    assert one_way["diffs"] == [2.0, -1.0, 4.0]
    with pytest.raises(ValueError, match="share no seed"):
        balance_study.paired(s, "a", "c", "val_ppl")


def _curve_rows():
    cfg = train.PRESETS["micro"]
    rows = []
    for label, base in (("none", 3.0), ("bias (loss-free)", 1.2)):
        for seed in (0, 1):
            log = fake_log(cfg, 150.0 + 10 * seed, base + seed / 10)
            log["curves"] = {"step": [10, 20], "imbalance": [base + 1, base + seed / 10],
                             "eval_step": [10, 20], "eval_ppl": [700.0, 150.0 + 10 * seed]}
            rows.append({"label": label, "seed": seed, **log})
    return rows


def test_training_curves_draw_each_seed_and_the_mean():
    import matplotlib

    matplotlib.use("Agg")
    from dispatch_book.figures import balance as plots

    fig = plots.training_curves(_curve_rows())
    imb, ppl = fig.axes
    means = [ln for ln in imb.lines if ln.get_linewidth() == 2]
    assert [ln.get_label() for ln in means] == ["none (2 seeds)", "bias (loss-free) (2 seeds)"]
    assert list(means[1].get_ydata()) == pytest.approx([2.2, 1.25])  # mean of the two seeds
    assert len(ppl.lines) == 2 * 3 and len(imb.lines) == 2 * 3 + 1  # + the balance line at 1
    assert ppl.get_yticks().tolist() == [150, 200, 300, 500, 700]  # labelled ticks on a log axis
    fig2 = plots.study_spread(_curve_rows())
    from matplotlib.collections import PathCollection

    dots = [c.get_offsets()[:, 1].tolist() for c in fig2.axes[1].collections if isinstance(c, PathCollection)]
    assert dots == [[150.0, 160.0], [150.0, 160.0]]  # one dot per seed, for each setting
