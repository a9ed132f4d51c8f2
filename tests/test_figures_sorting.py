"""Chapter 1's benchmark figure draws what the recording holds: a line per op and implementation."""
import matplotlib

matplotlib.use("Agg")

from dispatch_book.figures.sorting import routing_sort_figure  # noqa: E402

OPS = ("route", "sort", "route+sort")


def _doc(graph: bool) -> dict:
    rows = []
    for shape in ("a", "b"):
        for T in (1, 64, 4096):
            for op in OPS:
                for impl in ("ours", "torch"):
                    r = {"shape": shape, "E": 8, "K": 2, "T": T, "op": op, "impl": impl,
                         "median_ms": 0.001 * (T + 1) * (2 if impl == "torch" else 1)}
                    if graph:
                        r |= {"graph": True, "host_us": 20.0, "eager_ms": 0.05}
                    rows.append(r)
    return {"gpu": "GPU", "rows": rows}


def test_one_line_per_op_and_impl_in_t_order_and_the_axis_says_what_was_timed():
    for graph in (False, True):
        fig = routing_sort_figure(_doc(graph), ops=OPS)
        assert fig.axes[0].get_ylabel() == ("µs per call, CUDA graph" if graph else "µs per call (wall clock)")
        for ax in fig.axes:
            lines = ax.get_lines()
            assert sorted(ln.get_label() for ln in lines) == sorted(f"{o}: {i}" for o in OPS for i in ("ours", "torch"))
            ours = next(ln for ln in lines if ln.get_label() == "route: ours")
            assert list(ours.get_xdata()) == [1, 64, 4096]
            assert [round(y, 6) for y in ours.get_ydata()] == [2.0, 65.0, 4097.0]


def test_eager_sum_on_hand_made_rows():
    from dispatch_book.figures.sorting import eager_sum

    def row(op, graph_us, host_us, eager_us):
        return {"shape": "s", "T": 1, "op": op, "impl": "ours", "median_ms": graph_us / 1e3, "host_us": host_us,
                "eager_ms": eager_us / 1e3}

    # a 60 µs flush hides the host time: route (host 30) shows its GPU time, sort (host 70) 10 µs more
    doc = {"rows": [row("route", 5, 30, 5), row("sort", 10, 70, 20), row("route+sort", 15, 100, 55),
                    {"shape": "s", "T": 1, "op": "route", "impl": "torch", "median_ms": 1.0}]}
    got = eager_sum(doc)
    assert got["cases"] == 1 and got["graph"] == 1.0 and got["host"] == 1.0
    assert abs(got["eager"] - 55 / 25) < 1e-12 and got["hidden_us"] == 60
