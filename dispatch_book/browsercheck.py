"""The page checks that need a browser: each built page opened in headless Chromium, as a reader sees it.

``check(root, pages)`` serves ``root`` over HTTP on 127.0.0.1 (as a web host would: a missing file
is a 404), opens every page at a 1280 × 900 window and fails on:

* **a JavaScript error**: an uncaught exception or an unhandled promise rejection on the page (a
  listener installed before any of the page's scripts runs), e.g. a ``SyntaxError`` in an inline
  script;
* **a missing local resource**: any request to the book's own host answered with a status ≥ 400, or
  that failed (scripts, styles, fonts, images; also those a script requests later, e.g. a widget
  library's fonts). Requests to other hosts are not the book's to serve (and may be offline here);
* **a wide table without a scroll container**: a table in the article wider than the article's
  column, unless an element between them scrolls horizontally (``overflow-x: auto | scroll``) and
  fits the column;
* **figure text under 9 px**: an image in a cell's output whose PNG recorded its smallest text
  (``dispatch_book.figures.textsize``) at a height that, scaled as the page draws the image, is
  under ``MIN_TEXT_PX``.

Chromium and its driver: ``$DISPATCH_CHROMIUM`` / ``$DISPATCH_CHROMEDRIVER``, else ``chromium``
(or ``chromium-browser``, ``google-chrome``) and ``chromedriver`` on the PATH (or in
``$CHROMEWEBDRIVER``, as GitHub's runners have it); driven through Selenium, never downloading a
driver. ``find_browser()`` says what is missing.
"""
from __future__ import annotations

import base64
import functools
import http.server
import json
import os
import pathlib
import shutil
import threading
import time
import urllib.parse

from dispatch_book.figures.textsize import MIN_TEXT_PX, text_px

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--window-size=1280,900")
SETTLE_S = 1.0  # after the load event: time for the scripts' own requests (fonts, widget views)

# Installed before the page's scripts: uncaught errors and rejections are kept for the check.
CATCH_ERRORS = """
window.__pageErrors = [];
window.addEventListener('error', function (e) {
  if (e instanceof ErrorEvent) window.__pageErrors.push(e.message + ' (' + e.filename + ':' + e.lineno + ')');
}, true);
window.addEventListener('unhandledrejection', function (e) {
  var r = e.reason; window.__pageErrors.push('unhandled rejection: ' + (r && (r.message || r) || r));
});
"""

# Tables in the article wider than its column, and whether an ancestor scrolls them within it.
MEASURE_TABLES = """
var article = document.querySelector('article') || document.body;
var cs = getComputedStyle(article);
var column = article.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
var out = [];
article.querySelectorAll('table').forEach(function (t, i) {
  var width = Math.max(t.scrollWidth, t.getBoundingClientRect().width);
  if (width <= column + 1) return;
  var scrolls = false;
  for (var el = t.parentElement; el && el !== article; el = el.parentElement) {
    var o = getComputedStyle(el).overflowX;
    if ((o === 'auto' || o === 'scroll') && el.clientWidth <= column + 1) { scrolls = true; break; }
  }
  var head = t.querySelector('tr');
  out.push({index: i, width: Math.round(width), column: Math.round(column), scrolls: scrolls,
            columns: head ? head.children.length : 0});
});
return out;
"""

# Images in cell outputs: how wide the page draws them against their own pixels.
MEASURE_FIGURES = """
var out = [];
document.querySelectorAll('article .cell_output img').forEach(function (img) {
  out.push({src: img.getAttribute('src') || '', shown: img.getBoundingClientRect().width,
            natural: img.naturalWidth});
});
return out;
"""


def find_browser() -> tuple[str | None, str | None]:
    """(Chromium, chromedriver) paths, each None where not found."""
    browser = os.environ.get("DISPATCH_CHROMIUM") or next(
        filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"))),
        None)
    driver = os.environ.get("DISPATCH_CHROMEDRIVER") or shutil.which("chromedriver")
    if driver is None and os.environ.get("CHROMEWEBDRIVER"):
        candidate = pathlib.Path(os.environ["CHROMEWEBDRIVER"]) / "chromedriver"
        driver = str(candidate) if candidate.is_file() else None
    return browser, driver


def missing_browser() -> str | None:
    """What is missing to run the browser checks, or None."""
    browser, driver = find_browser()
    missing = [name for name, path in (("Chromium", browser), ("chromedriver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (the book extra)")
    if not missing:
        return None
    return (f"no {' and no '.join(missing)}: on Debian/Ubuntu `apt-get install chromium chromium-driver`, "
            "or set DISPATCH_CHROMIUM and DISPATCH_CHROMEDRIVER")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@functools.lru_cache(maxsize=None)
def _png(path: pathlib.Path) -> bytes:
    return path.read_bytes()


def _image_bytes(src: str, page: pathlib.Path) -> bytes | None:
    if src.startswith("data:"):
        head, _, data = src.partition(",")
        return base64.b64decode(data) if head.endswith(";base64") else None
    path = (page.parent / urllib.parse.unquote(src.split("#")[0].split("?")[0])).resolve()
    return _png(path) if path.is_file() else None


def _driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = find_browser()
    options = webdriver.ChromeOptions()
    for flag in FLAGS:
        options.add_argument(flag)
    options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=options)
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CATCH_ERRORS})
    return d


def _failed_requests(log: list, origin: str) -> list[str]:
    """The book's own requests that got a status >= 400 or failed, from Chromium's performance log."""
    urls, bad = {}, []
    for entry in log:
        m = json.loads(entry["message"])["message"]
        p = m.get("params", {})
        if m["method"] == "Network.requestWillBeSent":
            urls[p["requestId"]] = p["request"]["url"]
        elif m["method"] == "Network.responseReceived" and p["response"]["status"] >= 400:
            if p["response"]["url"].startswith(origin):
                bad.append(f"{p['response']['status']} {p['response']['url'][len(origin):]}")
        elif m["method"] == "Network.loadingFailed" and not p.get("canceled"):
            url = urls.get(p["requestId"], "")
            if url.startswith(origin) and p.get("errorText") != "net::ERR_ABORTED":
                bad.append(f"{p.get('errorText')} {url[len(origin):]}")
    return list(dict.fromkeys(bad))


def check_page(driver, origin: str, root: pathlib.Path, page: pathlib.Path, name: str, finding) -> list:
    """Every browser finding on one page (``finding(page, kind, detail)`` builds each)."""
    driver.get_log("performance")  # drop what the previous page left
    driver.get(origin + urllib.parse.quote(page.relative_to(root).as_posix()))
    time.sleep(SETTLE_S)
    found = [finding(name, "javascript", e) for e in driver.execute_script("return window.__pageErrors || []")]
    found += [finding(name, "missing", r) for r in _failed_requests(driver.get_log("performance"), origin)]
    for t in driver.execute_script(MEASURE_TABLES):
        if not t["scrolls"]:
            found.append(finding(name, "table", f"table {t['index'] + 1} ({t['columns']} columns) is {t['width']} px "
                                                 f"wide in a {t['column']} px column and nothing scrolls it"))
    for img in driver.execute_script(MEASURE_FIGURES):
        data = _image_bytes(img["src"], page)
        px = text_px(data) if data else None
        if px is None or not img["natural"]:
            continue  # no recorded text size (not drawn by matplotlib here), or not loaded (a 404 above)
        shown = px * img["shown"] / img["natural"]
        if shown < MIN_TEXT_PX:
            what = "data URI" if img["src"].startswith("data:") else img["src"].rsplit("/", 1)[-1][:16]
            found.append(finding(name, "figure text", f"{what}: smallest text {shown:.1f} px as shown "
                                                      f"({px:.1f} px drawn at {img['shown']:.0f}/{img['natural']} "
                                                      f"px) < {MIN_TEXT_PX:g} px"))
    return found


def check(root: pathlib.Path, pages: list[pathlib.Path], finding) -> list:
    """Open each of ``pages`` (files under ``root``) in headless Chromium; every finding."""
    root = pathlib.Path(root).resolve()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_port}/"
    driver = _driver()
    try:
        found = []
        for page in pages:
            found += check_page(driver, origin, root, pathlib.Path(page).resolve(),
                                pathlib.Path(page).resolve().relative_to(root).as_posix(), finding)
        return found
    finally:
        driver.quit()
        server.shutdown()
        server.server_close()
