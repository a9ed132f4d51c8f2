"""Chapter 8's figures (dispatch_book.figures.serving): the occupancy simulation and the experts-read
arithmetic by hand, and each drawing on hand-made inputs."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dispatch_book.figures import serving  # noqa: E402


def test_occupancy_by_hand():
    lens = [3, 1, 2, 2]  # two slots
    static = serving.occupancy(lens, 2, "static")
    # group (0, 1) runs 3 steps, request 1 idles its slot after 1; group (2, 3) runs 2
    assert static.tolist() == [[0, 0, 0, 2, 2], [1, -1, -1, 3, 3]]
    cont = serving.occupancy(lens, 2, "continuous")
    # slot 1 frees after step 0: request 2 takes it at step 1, request 3 when slot 0 frees
    assert cont.tolist() == [[0, 0, 0, 3, 3], [1, 2, 2, -1, -1]]
    for g in (static, cont):  # every request gets exactly its steps
        assert [int((g == i).sum()) for i in range(4)] == lens
    with pytest.raises(ValueError, match="mode"):
        serving.occupancy(lens, 2, "dynamic")
    with pytest.raises(ValueError, match="at least one"):
        serving.occupancy([0], 2, "static")


def test_continuous_never_takes_more_steps():
    rng = np.random.default_rng(0)
    for _ in range(20):
        lens = rng.integers(1, 30, rng.integers(1, 40)).tolist()
        slots = int(rng.integers(1, 9))
        steps = {m: serving.occupancy(lens, slots, m).shape[1] for m in ("static", "continuous")}
        assert steps["continuous"] <= steps["static"]


def test_experts_read_by_hand():
    rows = serving.experts_read([1, 64], E=8, K=2, H=4, I=2, layers=3, crossover=16, itemsize=2)
    assert rows[0]["path"] == "decode" and rows[1]["path"] == "grouped"
    assert rows[0]["experts_per_layer"] == pytest.approx(2.0)  # one token reads its K experts
    assert rows[0]["bytes"] == pytest.approx(3 * 2.0 * 3 * 4 * 2 * 2)
    assert rows[1]["experts_per_layer"] == pytest.approx(8 * (1 - 0.75 ** 64))
    assert rows[1]["bytes_per_token"] == pytest.approx(rows[1]["bytes"] / 64)


def test_drawings():
    for fig in (serving.plot_occupancy([3, 1, 2, 2, 5], 2),
                serving.plot_pool(6, {"a": [0, 1], "b": [0, 2]}),
                serving.plot_step_tokens({"chunked": [8, 8, 3], "whole": [20, 1, 1]}, budget=8),
                serving.plot_moe_twist(serving.experts_read([1, 8, 256], E=64, K=8, H=8, I=4, layers=2,
                                                            crossover=16), "t")):
        assert fig.axes
        plt.close(fig)
    occ = serving.plot_occupancy([3, 1, 2, 2], 2)
    assert "busy" in occ.axes[0].get_title() and occ.axes[1].get_title().startswith("continuous: 5 steps")
    plt.close(occ)
    pool = serving.plot_pool(4, {"a": [0, 1], "b": [0, 3]})
    hatched = [p.get_hatch() for p in pool.axes[0].patches]
    assert hatched == ["//", None, None, None]  # block 0 is shared
    plt.close(pool)


def test_latency_vs_load():
    rows = [{"part": "online", "contestant": c, "rate": r, "ttft_ms": {"p50": r * k, "p99": 2 * r * k},
             "tpot_ms": {"p50": k, "p99": 2 * k}} for c, k in (("ours", 1.0), ("hf_serve", 3.0)) for r in (1, 4)]
    rows.append({"part": "online", "contestant": "x", "did_not_run": "no"})
    fig = serving.latency_vs_load(rows, "t")
    labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
    assert labels == ["ours p50", "ours p99", "hf_serve p50", "hf_serve p99"]
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == [1.0, 1.0]
    plt.close(fig)
    with pytest.raises(ValueError, match="online rows"):
        serving.latency_vs_load(rows[-1:], "t")
