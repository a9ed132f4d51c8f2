"""The book's own Sphinx extension (``sphinx: extra_extensions`` in _config.yml).

* **Each script once.** The theme's extensions add some inline scripts twice to every page (the
  thebe configuration, a ``const THEBE_JS_URL`` declaration, and the toggle-button selector); a
  second ``const`` declaration of the same name is a ``SyntaxError`` in the browser. Scripts with
  the same source, body and attributes are kept once, in their first place.
* **The front door names its icon.** The site's root ``index.html`` only redirects to the first
  page; written by sphinx-external-toc it is a bare ``<meta>`` refresh, so a browser asks the
  server for ``/favicon.ico`` (a 404) before it moves on. The book writes that page itself, with
  the favicon the other pages link, before the extension would (it keeps an existing file).
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


def redirect_page(target: str, favicon: str | None) -> str:
    icon = f'<link rel="icon" href="{favicon}" />\n' if favicon else ""
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8" />\n{icon}'
            f'<meta http-equiv="Refresh" content="0; url={target}" />\n</head></html>\n')


def _root_index(app, exception) -> None:
    import pathlib

    root = str(getattr(app.config, "root_doc", None) or app.config.master_doc)
    for suffix in app.config.source_suffix or ():
        root = root.removesuffix(suffix)
    if exception is not None or "html" not in app.builder.format or root == "index":
        return
    target = f"{root}/index.html" if app.builder.name == "dirhtml" else f"{root}.html"
    icon = app.config.html_favicon
    favicon = f"_static/{pathlib.PurePosixPath(icon).name}" if icon and "://" not in icon else icon
    pathlib.Path(app.outdir, "index.html").write_text(redirect_page(target, favicon), encoding="utf8")


def setup(app):
    app.connect("html-page-context", _page_context, priority=900)  # after the extensions that add scripts
    app.connect("build-finished", _root_index, priority=400)  # before sphinx-external-toc's (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
