"""Glued numbers are written into the prose itself, so JupyterLab and Colab show them too."""
import json
import pathlib

import pytest

from dispatch_book import prose


def _nb(markdown, glued):
    outs = [{"output_type": "display_data", "metadata": {"scrapbook": {"name": k, "mime_prefix": "application/x/"}},
             "data": {"application/x/text/plain": repr(v)}} for k, v in glued.items()]
    return {"cells": [{"cell_type": "code", "source": "glue(...)", "outputs": outs},
                      {"cell_type": "markdown", "source": markdown}]}


def test_roles_become_spans_holding_their_values_and_spans_are_refreshed():
    nb = _nb("at {glue:text}`bw` (x{glue:text}`r:.2f`), **{glue:text}`bw`**", {"bw": "3.05 TB/s", "r": 1.23456})
    assert prose.render(nb) == []
    text = nb["cells"][1]["source"]
    assert text == ('at <span data-glue="bw">3.05 TB/s</span> (x<span data-glue="r:.2f">1.23</span>), '
                    '**<span data-glue="bw">3.05 TB/s</span>**')
    again = _nb(text, {"bw": "2.90 TB/s", "r": 2.0})
    assert prose.render(again) == []
    assert again["cells"][1]["source"] == ('at <span data-glue="bw">2.90 TB/s</span> (x<span data-glue="r:.2f">2.00'
                                           '</span>), **<span data-glue="bw">2.90 TB/s</span>**')
    assert prose.placeholders(again) == []


def test_a_value_no_cell_glued_is_named():
    nb = _nb("a {glue:text}`gone` and <span data-glue=\"old\">1</span>", {"bw": "x"})
    assert prose.render(nb) == ["gone", "old"]
    assert prose.placeholders(nb) == ["{glue:text}`gone`", "{glue:text}`old`"]


@pytest.mark.parametrize("nb_path", sorted(pathlib.Path(__file__).parent.parent.glob("notebooks/*.ipynb")),
                         ids=lambda p: p.stem)
def test_no_committed_chapter_shows_a_placeholder(nb_path):
    nb = json.loads(nb_path.read_text())
    assert prose.placeholders(nb) == [], "execute the chapter (python -m dispatch_book.build run ...)"


@pytest.mark.parametrize("nb_path", sorted(pathlib.Path(__file__).parent.parent.glob("notebooks/*.ipynb")),
                         ids=lambda p: p.stem)
def test_every_number_in_a_committed_chapter_is_glued_by_it_with_that_value(nb_path):
    nb = json.loads(nb_path.read_text())
    values = prose.glued(nb)
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"])
            assert prose.render_text(src, values) == (src, []), "re-render the chapter: its prose is out of date"
