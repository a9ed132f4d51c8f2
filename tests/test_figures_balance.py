"""Chapter 5's capacity figure (dispatch_book.figures.balance.capacity_tradeoff) on hand-made rows."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from dispatch_book.figures.balance import capacity_tradeoff  # noqa: E402


def _rows(*pairs):
    """Dropless first (capacity factor None), then (capacity factor, dropped fraction, perplexity)."""
    return [{"capacity_factor": cf, "dropped": d, "ppl": p} for cf, d, p in pairs]


def test_the_axis_stops_at_the_first_tick_half_again_above_the_largest_increase():
    ours = _rows((None, 0.0, 100.0), (1.5, 0.01, 100.3), (1.0, 0.14, 104.3))  # +0.3 %, +4.3 %
    fig = capacity_tradeoff(ours)
    ticks = list(fig.axes[0].get_yticks())
    assert ticks == [0, 1, 2, 5, 10], ticks  # not up to 1000: the axis keeps to the data
    assert fig.axes[0].get_ylim()[1] == 10
    plt.close(fig)


def test_the_anchor_widens_the_axis_and_coinciding_points_share_a_label():
    ours = _rows((None, 0.0, 10.0), (2.0, 0.0, 10.0), (1.0, 0.2, 13.0))  # dropless and CF 2.0 coincide
    anchor = _rows((None, 0.0, 10.0), (1.0, 0.3, 40.0))  # +300 %
    fig = capacity_tradeoff(ours, anchor, anchor_label="other")
    ax = fig.axes[0]
    assert list(ax.get_yticks())[-1] == 500 and ax.get_ylim()[1] == 500  # 1.5 x 300 = 450
    labels = [t.get_text() for t in ax.texts]
    assert "dropless, CF 2.0" in labels and labels.count("CF 1.0") == 2
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ours", "other"]
    plt.close(fig)
