"""The book names the GPU its numbers came from only through the data.

The chapters read one recording set (``dispatch_book.bench.sets``), of an H100 or an H200. A GPU's model
typed into the prose ("one run on an H200") turns false when another GPU's set replaces it; the name is
glued from the recording instead (``glue("gpu", sets.gpu_name())`` and ``<span data-glue="gpu">H200</span>``).
Every markdown cell of every chapter and every page of the book is checked. Inline code, fenced code and
glued values are not prose and are skipped; ``GENERIC`` lists the phrases that name a family of GPUs, not
the one measured.
"""
import pathlib
import re

import pytest
from book_pages import pages

ROOT = pathlib.Path(__file__).parent.parent


MODEL = re.compile(r"(?<![\w/])(A100|H100|H200|T4)(?![\w/])")
GENERIC = re.compile(r"A100/H100/H200|H100/H200|\ba (free )?T4\b|\bfree T4\b|\bColab T4s\b", re.I)

_NOT_PROSE = [
    re.compile(r"```.*?```", re.S),                         # fenced code
    re.compile(r"<span data-glue=[^>]*>.*?</span>", re.S),  # glued values
    re.compile(r"`[^`\n]*`"),                               # inline code
]


def prose(text: str) -> str:
    for rx in (*_NOT_PROSE, GENERIC):
        text = rx.sub(" ", text)
    return text


def typed_names(name: str, text: str) -> list[str]:
    """The GPU models typed into the prose of ``text``, each with the words around it."""
    text = prose(text)
    return [f"{name}: '{m.group(0)}' in: ...{' '.join(text[max(m.start() - 60, 0):m.end() + 20].split())}..."
            for m in MODEL.finditer(text)]


PAGES = pages()


@pytest.mark.parametrize("name,text", PAGES, ids=[n for n, _ in PAGES])
def test_the_book_names_the_measured_gpu_only_from_the_data(name, text):
    assert typed_names(name, text) == []


@pytest.mark.parametrize("sentence", [
    "One run on an H200, same model, prompts of 128 tokens.",
    "Measured alone on the H100, one row.",
    "The curves chapter 6 recorded on one H200's step times.",
    "An A100 would read less.",
])
def test_a_planted_gpu_name_is_caught(sentence):
    assert typed_names("planted.md", "A paragraph.\n\n" + sentence + "\n"), sentence


@pytest.mark.parametrize("sentence", [
    'One run on an <span data-glue="gpu">H200</span>, same model.',
    "fp8 tensor cores run at twice the bf16 rate on an H100/H200 (sm_89+).",
    "On a T4 the kernels compute in fp16; on A100/H100/H200-class GPUs in bf16.",
    "Open it on Colab (a free T4 will do); Colab T4s have 16 GB.",
    "The slug `h200` and `H200` in code are not prose.",
])
def test_generic_or_glued_names_pass(sentence):
    assert typed_names("clean.md", sentence) == []


def test_no_figure_names_a_gpu_of_its_own():
    """A figure's GPU comes from the recording it draws (or the set the chapters read), never from a
    string written into the drawing code."""
    root = ROOT / "dispatch_book"
    files = [*(root / "figures").glob("*.py"), root / "disagg_study.py", root / "spec_study.py"]
    named = [f"{f.name}:{i}" for f in files for i, line in enumerate(f.read_text().splitlines(), 1)
             if any(MODEL.search(m) for m in re.findall(r"[\"']([^\"']*)[\"']", line.split("#")[0]))]
    assert not named, f"GPU names written into figure code: {named}"
