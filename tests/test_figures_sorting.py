"""Chapter 1's benchmark figure draws what the recording holds, the graph timings included."""
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
                    r = {"shape": shape, "E": 8, "K": 2, "T": T, "op": op, "impl": impl, "median_ms": 0.01 * T ** 0.1}
                    if graph and impl == "ours":
                        r["graph_median_ms"] = 0.001 * (T + 1)
                    rows.append(r)
    return {"gpu": "GPU", "rows": rows}


def test_one_line_per_op_and_impl_and_the_graph_line_only_where_recorded():
    for graph in (False, True):
        fig = routing_sort_figure(_doc(graph), ops=OPS)
        for ax in fig.axes:
            labels = [ln.get_label() for ln in ax.get_lines()]
            assert len(labels) == 2 * len(OPS) + graph
            black = [ln for ln in ax.get_lines() if ln.get_color() == "black"]
            assert [ln.get_label() for ln in black] == (["route+sort: ours, graph"] if graph else [])
            if graph:  # µs per call, from graph_median_ms, in T order
                assert list(black[0].get_xdata()) == [1, 64, 4096]
                assert [round(y, 6) for y in black[0].get_ydata()] == [2.0, 65.0, 4097.0]
