"""The book's Sphinx extension: each script once per page."""
from types import SimpleNamespace

from dispatch_book.sphinx_ext import _page_context, unique_scripts


def js(filename, priority=500, **attributes):
    return SimpleNamespace(filename=filename, priority=priority, attributes=attributes)


def test_a_script_added_twice_is_kept_once_in_its_first_place():
    thebe = 'const THEBE_JS_URL = "x";'
    scripts = [js("a.js"), js(None, body=thebe), js("b.js", defer="defer"), js("", body=thebe),
               js("a.js", priority=200), js("b.js"), js(None, body="let other = 1;")]
    kept = unique_scripts(scripts)
    assert kept == [scripts[0], scripts[1], scripts[2], scripts[5], scripts[6]]  # b.js without defer is another tag
    context = {"script_files": scripts}
    _page_context(None, "page", "page.html", context, None)
    assert context["script_files"] == kept


def test_the_root_redirect_names_the_favicon(tmp_path):
    """The root index.html only redirects; without an icon link a browser asks for /favicon.ico (a 404)."""
    from types import SimpleNamespace

    from dispatch_book.sphinx_ext import _root_index

    app = SimpleNamespace(outdir=str(tmp_path), builder=SimpleNamespace(format="html", name="html"),
                          config=SimpleNamespace(root_doc="book/intro", master_doc="book/intro",
                                                 source_suffix={".md": "markdown"},
                                                 html_favicon="book/_static/favicon.svg"))
    _root_index(app, None)
    page = (tmp_path / "index.html").read_text()
    assert '<link rel="icon" href="_static/favicon.svg" />' in page and 'url=book/intro.html' in page
    (tmp_path / "index.html").unlink()
    _root_index(app, RuntimeError("the build failed"))  # a failed build writes nothing
    app.config.root_doc = "index"
    _root_index(app, None)  # the root page is a real page: nothing to write
    assert not (tmp_path / "index.html").exists()
