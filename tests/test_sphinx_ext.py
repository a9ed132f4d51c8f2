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
