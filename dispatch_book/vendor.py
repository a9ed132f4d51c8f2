"""The scripts the book's pages load, served from the book itself so pages render offline.

    python -m dispatch_book.vendor [DIR]      (run by ``make book``; DIR default book/_static/vendor)

MathJax (the equations) and the widget manager with require.js (the widgets' saved views) come from
the npm registry at pinned versions into DIR, which is not committed: ``_config.yml`` points
``mathjax_path`` and ``nb_ipywidgets_js`` at these files. Without npm (or without network) each
file becomes a small script that loads the same pinned version from the CDN instead, so the
book still builds and says that its pages then need a network.

The widget library loads its icon fonts from next to where require.js places its modules, which by
default is the page's own folder (``notebooks/@jupyter-widgets/...``: a 404 for each font).
``WIDGET_PATHS`` (``html-manager/paths.js``, loaded between require.js and the library) points
require.js at the folder that holds them: the vendored copy, or the CDN's.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

CDN = "https://cdn.jsdelivr.net/npm"


def _mathjax_keep(name: str) -> bool:
    top = name.split("/")[0]
    return (name == "tex-mml-chtml.js" or top in ("input", "ui", "a11y", "adaptors")
            or name.startswith("output/chtml")) and not name.endswith(".map")


def _widgets_keep(name: str) -> bool:
    # embed-amd.js holds the manager and the built-in widgets; the rest: its chunks, icon fonts (woff)
    return ("/" not in name and not name.endswith((".map", ".txt", ".eot", ".ttf", ".svg"))
            and name not in ("embed.js", "libembed-amd.js"))


# name -> (npm package, version, folder inside the package, which files to keep, the entry script)
PACKAGES = {
    "mathjax": ("mathjax", "3.2.2", "es5", _mathjax_keep, "tex-mml-chtml.js"),
    "html-manager": ("@jupyter-widgets/html-manager", "1.0.6", "dist", _widgets_keep, "embed-amd.js"),
    "requirejs": ("requirejs", "2.3.7", "", lambda name: name == "require.js", "require.js"),
}
_STAMP = ".versions"
WIDGET_PATHS = "html-manager/paths.js"
_WIDGETS = ("@jupyter-widgets/html-manager/dist", "@jupyter-widgets")  # module prefixes the library's chunks use


def paths_script(folder: str | None) -> str:
    """require.js configuration: the widget modules (and so their fonts) live in ``folder`` (a URL),
    or, for None, in the folder this script is served from."""
    where = f"{folder!r}" if folder else "here.slice(0, here.split('?')[0].lastIndexOf('/'))"
    return ("// The widget library's modules, and the fonts they load, live here (not next to the page).\n"
            "(function () {\n"
            "  var here = (document.currentScript || {}).src || '';\n"
            f"  var folder = {where};\n"
            "  require.config({paths: {" + ", ".join(f"'{m}': folder" for m in _WIDGETS) + "}});\n"
            "})();\n")


def _stamp() -> str:
    return "\n".join([*(f"{pkg}@{ver}" for pkg, ver, *_ in PACKAGES.values()), WIDGET_PATHS]) + "\n"


def _npm_pack(spec: str, tmp: pathlib.Path) -> pathlib.Path:
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed")
    res = subprocess.run([npm, "pack", "--silent", spec], cwd=tmp, capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"npm pack {spec} failed: {(res.stderr or res.stdout).strip()[-300:]}")
    return tmp / res.stdout.strip().splitlines()[-1]


def _extract(tgz: pathlib.Path, folder: str, keep, dest: pathlib.Path) -> int:
    prefix = "package/" + (folder + "/" if folder else "")
    n = 0
    with tarfile.open(tgz) as tar:
        for m in tar.getmembers():
            name = m.name.removeprefix(prefix)
            if not m.isfile() or not m.name.startswith(prefix) or ".." in name.split("/") or not keep(name):
                continue
            out = dest / name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(tar.extractfile(m).read())
            n += 1
    return n


def cdn_shim(url: str) -> str:
    """A script that loads ``url`` in its place: in order while the page is parsed, else appended."""
    return ("// npm was not available when this book was built: this page loads the script from the CDN.\n"
            "(function () {\n"
            f"  var url = {url!r};\n"
            "  if (document.readyState === 'loading' && !(document.currentScript || {}).defer) {\n"
            "    document.write('<script src=\"' + url + '\"><\\/script>');\n"
            "  } else {\n"
            "    var s = document.createElement('script'); s.src = url; document.head.appendChild(s);\n"
            "  }\n"
            "})();\n")


def fetch(dest: pathlib.Path) -> bool:
    """Fill ``dest`` with the pinned scripts; True if they are local, False if CDN shims were written."""
    dest = pathlib.Path(dest)
    if (dest / _STAMP).is_file() and (dest / _STAMP).read_text() == _stamp():
        return True
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name, (pkg, ver, folder, keep, entry) in PACKAGES.items():
                n = _extract(_npm_pack(f"{pkg}@{ver}", pathlib.Path(tmp)), folder, keep, dest / name)
                if not (dest / name / entry).is_file():
                    raise RuntimeError(f"{pkg}@{ver} has no {folder}/{entry} ({n} files kept)")
    except (RuntimeError, OSError, subprocess.TimeoutExpired, tarfile.TarError) as e:
        shutil.rmtree(dest)
        for name, (pkg, ver, folder, _, entry) in PACKAGES.items():
            (dest / name).mkdir(parents=True)
            path = "/".join(p for p in (folder, entry) if p)
            (dest / name / entry).write_text(cdn_shim(f"{CDN}/{pkg}@{ver}/{path}"))
        pkg, ver, folder, *_ = PACKAGES["html-manager"]
        (dest / WIDGET_PATHS).write_text(paths_script(f"{CDN}/{pkg}@{ver}/{folder}"))
        print(f"vendor: {e}.\nvendor: the book's pages will load MathJax and the widget library from "
              f"{CDN} (they need a network to show equations and widgets).", file=sys.stderr)
        return False
    (dest / WIDGET_PATHS).write_text(paths_script(None))
    (dest / _STAMP).write_text(_stamp())
    return True


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.vendor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest", nargs="?", default="book/_static/vendor")
    args = ap.parse_args(argv)
    local = fetch(pathlib.Path(args.dest))
    print(f"vendor: {'pinned copies' if local else 'CDN loaders'} in {args.dest}: "
          + ", ".join(f"{pkg}@{ver}" for pkg, ver, *_ in PACKAGES.values()))


if __name__ == "__main__":
    main()
