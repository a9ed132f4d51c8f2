"""Chapter 9's figures (dispatch_book.figures.speculative) on hand-made inputs."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dispatch.arithmetic import expected_unique_experts  # noqa: E402
from dispatch_book.figures.speculative import experts_touched, payoff, price_curve, race  # noqa: E402


def test_experts_touched_three_curves():
    routing = {"windows": [1, 2, 3], "E": 4, "K": 2, "measured": [2.0, 2.5, 2.8],
               "inclusion_LE": [[0.5, 0.5, 0.5, 0.5], [1.0, 0.5, 0.5, 0.0]]}
    fig = experts_touched(routing, "t")
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["E(1 - (1 - K/E)^w), E=4, K=2",
                                               "independent tokens, measured expert shares",
                                               "consecutive tokens of real text"]
    assert list(lines[0].get_ydata()) == pytest.approx([expected_unique_experts(4, 2, w) for w in (1, 2, 3)])
    # layer 0 uniform (2, 3, 3.5); layer 1: expert 0 always, 3 never: 1 + 2(1 - 0.5^w) → (2, 2.5, 2.75)
    assert list(lines[1].get_ydata()) == pytest.approx([2.0, 2.75, 3.125])
    assert list(lines[2].get_ydata()) == [2.0, 2.5, 2.8]
    plt.close(fig)


def test_price_curve_normalised_by_k0():
    fig = price_curve({"a": [2.0, 3.0, 4.0]}, {"a": [10.0, 11.0, 12.0]}, "t")
    lines = fig.axes[0].get_lines()
    assert list(lines[0].get_ydata()) == [1.0, 1.5, 2.0] and lines[0].get_label() == "a (measured)"
    assert list(lines[1].get_ydata()) == pytest.approx([1.0, 1.1, 1.2]) and lines[1].get_linestyle() == "--"
    plt.close(fig)
    with pytest.raises(ValueError):
        price_curve({})


def test_payoff_replays_the_traces():
    # every position would keep 3 drafts; a step costs 1 + k/10 of a plain step (1.0)
    runs = {"lookup": [[3] * 401], "draft": [[3] * 401]}
    costs = {"lookup": [1.0, 1.1, 1.2, 1.3], "draft": [None, 1.1, 1.2, 1.3]}
    fig, table = payoff(runs, costs, 1.0, "t")
    assert table["lookup"][0] == pytest.approx(1.0)
    assert table["lookup"][3] == pytest.approx(400 / (100 * 1.3))  # 100 steps of 4 tokens
    assert set(table["draft"]) == {1, 2, 3, "adaptive"}
    assert table["lookup"]["adaptive"] >= 0.95 * table["lookup"][3]
    plt.close(fig)


def test_race_bars_and_speedups():
    fig = race({"plain": 100.0, "lookup": 180.0}, "t")
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [100.0, 180.0]
    assert [t.get_text() for t in ax.texts] == [" 1.00x", " 1.80x"]
    plt.close(fig)
    with pytest.raises(ValueError, match="baseline"):
        race({"a": 1.0}, "t")
