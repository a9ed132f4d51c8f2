"""The check over the built book, on small pages made in the theme's shape."""
import base64
import hashlib
import struct
import zlib

import pytest

from dispatch_book import htmlcheck


def png(width: int, height: int = 10) -> bytes:
    """A valid grey PNG of the given size."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def page(tmp_path, article: str, chrome: str = "", name: str = "page.html"):
    html = (f"<html><head><title>t</title></head><body><nav>{chrome}</nav>"
            f"<main><article class=\"bd-article\">{article}</article></main></body></html>")
    path = tmp_path / name
    path.write_text(html, encoding="utf-8")
    return path


def cell(source: str = "x = 1", output: str = "", image: str = "") -> str:
    out = (f'<div class="output stream highlight-myst-ansi notranslate"><div class="highlight"><pre>{output}'
           "</pre></div></div>") if output else ""
    return ('<div class="cell docutils container"><div class="cell_input docutils container">'
            f'<div class="highlight-ipython3 notranslate"><div class="highlight"><pre><span></span>{source}'
            f'</pre></div></div></div><div class="cell_output docutils container">{out}{image}</div></div>')


def kinds(path) -> list[str]:
    return [f.kind for f in htmlcheck.check_page(path)]


def test_a_clean_page_passes(tmp_path):
    src = "<span class=\"n\">y</span> = " + "1 + " * 20 + "1"  # 87 characters once the tags are gone
    assert len("y = " + "1 + " * 20 + "1") <= 88
    p = page(tmp_path, "<p>Routing sends each token to K experts.</p>" + cell(src, "a" * 88))
    assert htmlcheck.check_page(p) == []


@pytest.mark.parametrize("length, bad", [(88, False), (89, True), (140, True)])
def test_code_lines_over_88_characters_fail(tmp_path, length, bad):
    line = "x = " + "a" * (length - 4)
    p = page(tmp_path, cell(f"short = 1\n<span>{line[:10]}</span>{line[10:]}\n"))
    assert kinds(p) == (["code"] if bad else [])


def test_entities_count_as_one_character(tmp_path):
    line = "x = " + "&lt;" * 84  # 88 characters on the page
    assert kinds(page(tmp_path, cell(line))) == []
    assert kinds(page(tmp_path, cell(line + "&gt;"))) == ["code"]


def test_wide_output_lines_fail(tmp_path):
    assert kinds(page(tmp_path, cell(output="T  tokens/s\n" + "9" * 89))) == ["output"]
    assert kinds(page(tmp_path, cell(output="ok\n" + "9" * 88))) == []


def test_code_blocks_in_prose_are_held_to_the_code_limit(tmp_path):
    block = ('<div class="highlight-bash notranslate"><div class="highlight"><pre>make book ' + "x" * 90
             + "</pre></div></div>")
    assert kinds(page(tmp_path, block)) == ["code"]


def test_code_outside_the_article_is_not_checked(tmp_path):
    assert kinds(page(tmp_path, cell(), chrome="<pre>" + "x" * 200 + "</pre>")) == []


@pytest.mark.parametrize("width, bad", [(900, False), (965, False), (990, True), (1710, True)])
def test_figures_wider_than_the_column_over_0_7_fail(tmp_path, width, bad):
    (tmp_path / "_images").mkdir()
    (tmp_path / "_images" / "fig.png").write_bytes(png(width))
    p = page(tmp_path, cell(image='<img alt="fig" src="_images/fig.png" />'))
    assert kinds(p) == (["figure"] if bad else [])


def test_figures_in_data_uris_are_measured(tmp_path):
    uri = "data:image/png;base64," + base64.b64encode(png(1600)).decode()
    assert kinds(page(tmp_path, cell(image=f'<img src="{uri}"/>'))) == ["figure"]
    small = "data:image/png;base64," + base64.b64encode(png(700)).decode()
    assert kinds(page(tmp_path, cell(image=f'<img src="{small}"/>'))) == []


def test_a_width_attribute_is_the_drawn_width(tmp_path):
    """A retina PNG (2x pixels) declares its CSS width; that is what the page draws."""
    uri = "data:image/png;base64," + base64.b64encode(png(1400)).decode()
    assert kinds(page(tmp_path, cell(image=f'<img src="{uri}" width="700"/>'))) == []
    assert kinds(page(tmp_path, cell(image=f'<img src="{uri}" width="1200px"/>'))) == ["figure"]


def test_images_outside_outputs_and_non_png_are_not_measured(tmp_path):
    (tmp_path / "logo.png").write_bytes(png(3000))
    (tmp_path / "fig.svg").write_text("<svg/>")
    body = '<p><img src="logo.png"/></p>' + cell(image='<img src="fig.svg"/><img src="missing.png"/>')
    assert kinds(page(tmp_path, body)) == []


# Spelled in pieces, so that a search of the repository for these words finds only the check itself.
@pytest.mark.parametrize("text", [
    "see " + "shared" + "/design.md", "as the " + "issue asked", "Known issues", "ticket 12", "a small helper",
    "helpers", "The lead decided",
])
def test_words_about_how_the_book_was_made_fail(tmp_path, text):
    assert kinds(page(tmp_path, f"<p>{text}</p>")) == ["words"]
    assert kinds(page(tmp_path, cell(output=text))) == ["words"]
    assert kinds(page(tmp_path, cell(f"# {text}"))) == ["words"]


@pytest.mark.parametrize("text", [
    "an issue of bandwidth", "helper_fn = 1", "_helpers", "leading dimension", "the leader rank",
    "sharedmem", "lead time",
])
def test_ordinary_words_pass(tmp_path, text):
    assert kinds(page(tmp_path, f"<p>{text}</p>" + cell(text))) == []


def test_hidden_names_are_found_by_their_digest(tmp_path, monkeypatch):
    """The names the book must never mention are kept as digests; a stand-in name shows the mechanism."""
    digest = hashlib.sha256(b"zanzibar").hexdigest()
    monkeypatch.setattr(htmlcheck, "HIDDEN", frozenset({digest}))
    for text in ["the Zanzibar numbers", "ZANZIBAR's kernels", "zanzibar-v2", "(zanzibar)", "zanzibar_gemm"]:
        assert kinds(page(tmp_path, f"<p>{text}</p>")) == ["words"], text
        assert kinds(page(tmp_path, cell(output=text))) == ["words"], text
        assert kinds(page(tmp_path, cell(f"# {text}"))) == ["words"], text
    for text in ["zanzibars", "a zanzi bar", "zanzibar2"]:  # whole words; `_` and `-` separate words
        assert kinds(page(tmp_path, f"<p>{text}</p>")) == [], text


def test_the_shipped_hidden_names_are_digests_and_miss_ordinary_words():
    assert htmlcheck.HIDDEN and all(len(d) == 64 and set(d) <= set("0123456789abcdef") for d in htmlcheck.HIDDEN)
    prose = "Routing sends each token to K experts; the grouped GEMM reads each expert's weights once."
    assert htmlcheck.hidden_words(prose) == []


def test_the_theme_chrome_may_say_issues(tmp_path):
    chrome = '<a href="https://github.com/x/y/issues/new" title="Open an issue">Open issues</a>'
    assert kinds(page(tmp_path, "<p>fine</p>", chrome=chrome)) == []


def test_the_cli_reports_each_page_and_fails(tmp_path, capsys):
    book = tmp_path / "html"
    (book / "notebooks").mkdir(parents=True)
    page(book, "<p>front page</p>", name="index.html")
    page(book / "notebooks", cell("y = 2"), name="good.html")
    assert htmlcheck.main(["--browser", "off", str(book)]) == 0
    page(book / "notebooks", cell("z" * 100, output="o" * 95) + "<p>the lead said</p>", name="bad.html")
    (book / "_static").mkdir()
    page(book / "_static", "<p>helpers</p>", name="theme.html")  # the theme's files are not pages
    assert htmlcheck.main(["--browser", "off", str(book)]) == 1
    out = capsys.readouterr().out
    assert "notebooks/bad.html: 1 code, 1 output, 1 words" in out and "good.html:" not in out
    assert "theme.html" not in out


def test_without_chromium_the_browser_checks_are_skipped_or_required(tmp_path, monkeypatch, capsys):
    from dispatch_book import browsercheck

    page(tmp_path, "<p>front page</p>", name="index.html")
    monkeypatch.setattr(browsercheck, "missing_browser", lambda: "no Chromium: install it")
    assert htmlcheck.main([str(tmp_path)]) == 0  # auto: the static checks, and a word about the others
    assert "browser checks skipped" in capsys.readouterr().out
    assert htmlcheck.main(["--browser", "required", str(tmp_path)]) == 2
    assert "cannot run: no Chromium" in capsys.readouterr().err


def test_an_unbuilt_book_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="build the book first"):
        htmlcheck.check(tmp_path)
