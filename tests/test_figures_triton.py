"""Chapter 0.5's figure: one labelled tile per program, the chosen program's tile and reads marked."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from dispatch_book.figures.triton import READ, TILE, program_grid  # noqa: E402


def test_one_label_per_program_and_the_chosen_tile_filled():
    fig = program_grid(50, 40, 72, 16, 16, 16, pid=(1, 2))
    a_ax, b_ax, c_ax = fig.axes
    labels = sorted(t.get_text() for t in c_ax.texts)
    assert labels == sorted(f"({i},{j})" for i in range(4) for j in range(3))  # cdiv(50,16) × cdiv(40,16)
    filled = [p for p in c_ax.patches if isinstance(p, Rectangle) and p.get_fill()
              and matplotlib.colors.to_hex(p.get_facecolor()) == TILE]
    assert len(filled) == 1 and filled[0].get_xy() == (32, 16)
    assert (filled[0].get_width(), filled[0].get_height()) == (8, 16)  # N = 40: the last column tile is cut
    read_a = [p for p in a_ax.patches if matplotlib.colors.to_hex(p.get_facecolor()) == READ]
    read_b = [p for p in b_ax.patches if matplotlib.colors.to_hex(p.get_facecolor()) == READ]
    assert [(p.get_xy(), p.get_width(), p.get_height()) for p in read_a] == [((0, 16), 72, 16)]
    assert [(p.get_xy(), p.get_width(), p.get_height()) for p in read_b] == [((32, 0), 8, 72)]
    assert len(a_ax.lines) == 4  # the K loop's steps: 72 in blocks of 16 → 5 steps, 4 boundaries
    assert "grid (4, 3)" in fig._suptitle.get_text()


def test_an_exact_fit_has_no_masked_overhang():
    fig = program_grid(32, 32, 16, 16, 16, 16, pid=(0, 0))
    c_ax = fig.axes[2]
    grey = [p for p in c_ax.patches if matplotlib.colors.to_hex(p.get_facecolor()) == "#d9d9d9"]
    assert grey == [] and len(c_ax.texts) == 4


@pytest.mark.parametrize("args, pid", [((0, 8, 8, 4, 4, 4), (0, 0)), ((8, 8, 8, 4, 4, 0), (0, 0)),
                                       ((8, 8, 8, 4, 4, 4), (2, 0)), ((8, 8, 8, 4, 4, 4), (0, -1))])
def test_bad_sizes_and_programs_outside_the_grid_raise(args, pid):
    with pytest.raises(ValueError):
        program_grid(*args, pid=pid)
