"""Chapter 6's decode figure (dispatch_book.figures.engine.decode_throughput) on a hand-made recording."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from dispatch_book.figures.engine import decode_throughput  # noqa: E402

NAMES = ["ours", "ours_int8", "ours_fp8", "ours_no_pdl", "ours_cublas_sdpa", "hf_graph_dispatch", "hf_graph",
         "hf_grouped_mm", "hf_batched_mm", "hf_eager", "hf_compile_static", "hf_extra"]


def _doc():
    rows = [{"contestant": n, "batch": b, "decode_tok_s": 100.0 * (i + 1) * b, "roofline_tok_s": 5000.0 * b}
            for i, n in enumerate(NAMES) for b in (1, 8, 64)]
    rows.append({"contestant": "hf_batched_mm", "batch": 256, "error": "out of memory"})  # not drawn
    return {"rows": rows}


def test_every_contestant_its_own_line_and_colour_ours_solid_theirs_dotted():
    fig = decode_throughput(_doc(), "t")
    ax = fig.axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert list(lines) == [*NAMES, "bandwidth roofline (bf16)"]
    colours = [to_hex(lines[n].get_color()) for n in NAMES]
    assert len(set(colours)) == len(NAMES), "twelve lines, twelve colours"
    assert all(lines[n].get_linestyle() == ("-" if n.startswith("ours") else ":") for n in NAMES)
    assert list(lines["ours"].get_ydata()) == [100.0, 800.0, 6400.0] and lines["ours"].get_linewidth() == 2.5
    assert list(lines["bandwidth roofline (bf16)"].get_ydata()) == [5000.0, 40000.0, 320000.0]
    assert list(ax.get_xticks()) == [1, 8, 64] and ax.get_title() == "t"
    plt.close(fig)


def test_a_recording_without_decode_rows_is_refused():
    with pytest.raises(ValueError, match="decode_tok_s"):
        decode_throughput({"rows": [{"contestant": "ours", "batch": 1, "error": "x"}]}, "t")
