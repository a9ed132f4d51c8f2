"""Numbers in the prose, where every reader reads: glued values written into the markdown itself.

A chapter computes a number in a code cell and glues it (``checks.glue("read_tbs", "3.05 TB/s")``);
its prose names it, ``{glue:text}`read_tbs```. myst-nb fills such a role in the built book only: in
JupyterLab or Colab a reader would see the role, not the number. So every execution of a chapter
(:func:`dispatch_book.execute.execute`) renders the roles into the markdown cells it writes::

    {glue:text}`read_tbs`                          →  <span data-glue="read_tbs">3.05 TB/s</span>
    <span data-glue="read_tbs">3.02 TB/s</span>     →  <span data-glue="read_tbs">3.05 TB/s</span>

The span shows its value in every renderer and keeps its name, so the next execution replaces the
value again. A name that no code cell of the run glued is an error naming it: the prose refers to
a number the chapter no longer computes.
"""
from __future__ import annotations

import ast
import re

ROLE = re.compile(r"\{glue:text\}`([^`:]+)(?::([^`]*))?`")
SPAN = re.compile(r'<span data-glue="([^":]+)(?::([^"]*))?">(.*?)</span>', re.S)


def glued(nb) -> dict[str, object]:
    """name → value of every glue output of an executed notebook (myst-nb's scrapbook records)."""
    out = {}
    for cell in nb["cells"]:
        for o in cell.get("outputs", []):
            rec = o.get("metadata", {}).get("scrapbook")
            if not rec:
                continue
            text = o.get("data", {}).get(rec.get("mime_prefix", "") + "text/plain")
            if text is None:
                continue
            text = "".join(text) if isinstance(text, list) else text
            try:
                out[rec["name"]] = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                out[rec["name"]] = text
    return out


def _span(name: str, spec: str | None, values: dict, missing: list) -> str:
    if name not in values:
        missing.append(name)
        return f"{{glue:text}}`{name}`"
    v = values[name]
    text = format(v, spec) if spec else str(v)
    key = f"{name}:{spec}" if spec else name
    return f'<span data-glue="{key}">{text}</span>'


def render_text(text: str, values: dict) -> tuple[str, list[str]]:
    """``text`` with every glue role and glued span holding its value now; the names not found."""
    missing: list[str] = []
    text = SPAN.sub(lambda m: _span(m.group(1), m.group(2), values, missing), text)
    text = ROLE.sub(lambda m: _span(m.group(1), m.group(2), values, missing), text)
    return text, missing


def render(nb) -> list[str]:
    """Render the glued values into ``nb``'s markdown cells, in place; returns the names it could not
    find (empty when every number in the prose was glued by this run)."""
    values, missing = glued(nb), []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        new, miss = render_text(src, values)
        missing += miss
        if new != src:
            cell["source"] = new
    return sorted(set(missing))


def placeholders(nb) -> list[str]:
    """The glue roles left in ``nb``'s markdown cells (a reader outside the built book would see them)."""
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            found += [m.group(0) for m in ROLE.finditer(src)]
    return found
