"""The book's pinned scripts: without npm each becomes a loader of the same pinned version's CDN file."""
import pathlib

from dispatch_book import vendor


def test_without_npm_every_script_loads_its_pinned_cdn_copy(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(vendor.shutil, "which", lambda name: None)
    assert vendor.fetch(tmp_path / "v") is False
    assert "need a network" in capsys.readouterr().err
    for name, (pkg, ver, folder, _, entry) in vendor.PACKAGES.items():
        shim = (tmp_path / "v" / name / entry).read_text()
        path = "/".join(p for p in (folder, entry) if p)
        assert f"'{vendor.CDN}/{pkg}@{ver}/{path}'" in shim and shim.rstrip().endswith("})();")
    assert not (tmp_path / "v" / ".versions").exists(), "a fallback is fetched again next time"
    pkg, ver, folder, *_ = vendor.PACKAGES["html-manager"]  # the widgets' fonts: from the CDN's copy too
    assert f"var folder = '{vendor.CDN}/{pkg}@{ver}/{folder}';" in (tmp_path / "v" / vendor.WIDGET_PATHS).read_text()


def test_the_widget_modules_and_their_fonts_resolve_to_the_vendored_folder():
    """require.js places the widget library's modules (whose folder its fonts are loaded from) in the
    folder paths.js is served from, for both module names the library's chunks use."""
    script = vendor.paths_script(None)
    assert "here.slice(0, here.split('?')[0].lastIndexOf('/'))" in script
    assert ("require.config({paths: {'@jupyter-widgets/html-manager/dist': folder, "
            "'@jupyter-widgets': folder}});") in script


def test_the_config_loads_the_vendored_entry_scripts():
    import yaml

    root = pathlib.Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((root / "_config.yml").read_text())["sphinx"]["config"]
    entries = {f"vendor/{name}/{entry}" for name, (*_, entry) in vendor.PACKAGES.items()}
    assert entries | {f"vendor/{vendor.WIDGET_PATHS}"} == {cfg["mathjax_path"], *cfg["nb_ipywidgets_js"]}
    widgets = list(cfg["nb_ipywidgets_js"])  # require.js, then its paths, then the library
    assert widgets.index("vendor/requirejs/require.js") < widgets.index(f"vendor/{vendor.WIDGET_PATHS}") \
        < widgets.index("vendor/html-manager/embed-amd.js")
    assert "book/_static" in cfg["html_static_path"]


def test_only_the_needed_files_are_kept():
    mathjax = vendor.PACKAGES["mathjax"][3]
    assert mathjax("tex-mml-chtml.js") and mathjax("output/chtml/fonts/woff-v2/MathJax_Main-Regular.woff")
    assert not mathjax("tex-svg.js") and not mathjax("sre/mathmaps/en.json") and not mathjax("output/svg.js")
    widgets = vendor.PACKAGES["html-manager"][3]
    assert widgets("embed-amd.js") and widgets("1551f4f60c37af51121f.woff2")
    assert not widgets("embed.js.map") and not widgets("libembed-amd.js")
