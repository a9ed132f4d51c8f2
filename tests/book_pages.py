"""The book's prose, page by page, for the tests that read it (voice, citations, GPU names): every
chapter's markdown cells joined, and every page under book/."""
import json
import pathlib

ROOT = pathlib.Path(__file__).parent.parent


def pages() -> list[tuple[str, str]]:
    """(file name, its prose) of every notebook under notebooks/ and every page under book/."""
    out = []
    for p in sorted(ROOT.glob("notebooks/*.ipynb")):
        nb = json.loads(p.read_text())
        md = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
              for c in nb["cells"] if c["cell_type"] == "markdown"]
        out.append((p.name, "\n\n".join(md)))
    out.extend((p.name, p.read_text()) for p in sorted(ROOT.glob("book/*.md")))
    return out
