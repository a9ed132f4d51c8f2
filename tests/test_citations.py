"""Every citation in the book names an entry of book/references.bib, and every entry can be found.

The chapters and pages cite with MyST roles, {cite}`key` or {cite}`a,b` (also {cite:p} and {cite:t});
sphinxcontrib-bibtex resolves them against ``bibtex_bibfiles`` in _config.yml. An unknown key is
only a warning in a Sphinx build, and a reader sees a bare "[key]": here it fails.
"""
import pathlib
import re

import pytest
from book_pages import pages

ROOT = pathlib.Path(__file__).parent.parent
BIB = ROOT / "book" / "references.bib"
CITE = re.compile(r"\{cite(?::[a-z]+)?\}`([^`]*)`")
# an entry must say where to find it: an arXiv id, a DOI, a venue or an address
LOCATORS = ("eprint", "doi", "booktitle", "journal", "howpublished", "url")


def cited_keys(text: str) -> list[str]:
    return [k.strip() for m in CITE.finditer(text) for k in m.group(1).split(",") if k.strip()]


PAGES = pages()


def _entries():
    from pybtex.database import parse_file  # sphinxcontrib-bibtex's parser
    return parse_file(str(BIB)).entries


def test_the_config_reads_this_bibliography():
    assert "book/references.bib" in (ROOT / "_config.yml").read_text()


def test_the_bibliography_parses_with_every_entry_closed():
    text = BIB.read_text()
    starts = len(re.findall(r"^@\w+\{", text, re.M))
    assert len(_entries()) == starts, "an entry swallowed the next one: a closing brace is missing"
    depth = 0
    for ch in text:
        depth += {"{": 1, "}": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0


def test_every_entry_has_author_title_year_and_where_to_find_it():
    for key, e in _entries().items():
        assert e.persons.get("author") or "author" in e.fields, key
        for field in ("title", "year"):
            assert field in e.fields, (key, field)
        assert any(f in e.fields for f in LOCATORS), (key, "no eprint, doi, venue or address")


@pytest.mark.parametrize("name,text", PAGES, ids=[n for n, _ in PAGES])
def test_every_cited_key_is_in_the_bibliography(name, text):
    known = set(_entries())
    assert [k for k in cited_keys(text) if k not in known] == []


def test_the_book_cites_something():
    assert sum(len(cited_keys(t)) for _, t in PAGES) > 0


def test_an_unknown_key_is_caught():
    assert cited_keys("as {cite}`kwon2023vllm,nobody2099` and {cite:t}`x`") == ["kwon2023vllm", "nobody2099", "x"]
    assert "nobody2099" not in set(_entries())
