"""The book's own Sphinx extension (``sphinx: extra_extensions`` in _config.yml).

* **Each script once.** The theme's extensions add some inline scripts twice to every page (the
  thebe configuration, a ``const THEBE_JS_URL`` declaration, and the toggle-button selector); a
  second ``const`` declaration of the same name is a ``SyntaxError`` in the browser. Scripts with
  the same source, body and attributes are kept once, in their first place.
"""
from __future__ import annotations


def _key(js) -> tuple:
    """(source, attributes); an inline script's source is None or "" depending on who added it."""
    attributes = getattr(js, "attributes", {}) or {}
    return (str(getattr(js, "filename", js) or ""), tuple(sorted((k, str(v)) for k, v in attributes.items())))


def unique_scripts(scripts) -> list:
    """``scripts`` with each (source, attributes) once, in first-seen order; priorities are ignored."""
    seen, kept = set(), []
    for js in scripts:
        key = _key(js)
        if key not in seen:
            seen.add(key)
            kept.append(js)
    return kept


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if "script_files" in context:
        context["script_files"] = unique_scripts(context["script_files"])


def setup(app):
    app.connect("html-page-context", _page_context, priority=900)  # after the extensions that add scripts
    return {"parallel_read_safe": True, "parallel_write_safe": True}
