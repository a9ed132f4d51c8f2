"""python -m dispatch.generate on bad input: flags are checked with messages that name them, and the
model's context is never overrun silently (refused when the prompt fills it, else cut with a warning)."""
import io

import pytest

from dispatch import generate, train

CONTEXT = 16  # the shipped model's context (128) cut short, so that the tests generate few tokens


@pytest.fixture(scope="module")
def shipped():
    loaded = train.load("cpu", device="cpu")
    loaded.model.config.max_position_embeddings = CONTEXT
    return loaded


def _run(*argv, shipped=None, monkeypatch=None):
    if shipped is not None:
        monkeypatch.setattr(train, "load", lambda *a, **k: shipped)
    buf = io.StringIO()
    return generate.main(["--model", "cpu", *argv], out=buf), buf.getvalue()


def test_generation_past_the_context_is_cut_with_a_warning(shipped, monkeypatch):
    """Was: ran past the context without a word (transformers warns)."""
    with pytest.warns(UserWarning, match=f"exceeds the model's context of {CONTEXT} tokens: generating"):
        rep, _ = _run("--prompt", "def ", "--max-new-tokens", "50", shipped=shipped, monkeypatch=monkeypatch)
    assert max(rep["new_tokens"]) <= CONTEXT - 1


def test_a_prompt_that_fills_the_context_is_refused(shipped, monkeypatch):
    with pytest.raises(SystemExit, match=f"the model's context is {CONTEXT}"):
        _run("--prompt", "x = 1\n" * CONTEXT, "--max-new-tokens", "4", shipped=shipped, monkeypatch=monkeypatch)


def test_fit_context_by_hand():
    assert generate.fit_context(10, 5, 16) == 5 and generate.fit_context(10, 5, None) == 5
    with pytest.warns(UserWarning):
        assert generate.fit_context(10, 50, 16) == 6
    with pytest.raises(ValueError, match="no room"):
        generate.fit_context(16, 1, 16)


@pytest.mark.parametrize("argv, says", [
    (["--max-new-tokens", "-5"], "--max-new-tokens must be >= 1, got -5"),  # was: "max_seq must be >= 2, got -2"
    (["--batch", "0"], "--batch must be 1..256 rows, got 0"),  # was: "need 1..1 prompts"
    (["--batch", "300"], "--batch must be 1..256"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (["--top-p", "0"], r"--top-p must lie in \(0, 1\]"),
])
def test_bad_flags_name_themselves(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        generate.parse(["--prompt", "x", *argv])
    assert e.value.code == 2
    assert pytest.importorskip("re").search(says, capsys.readouterr().err)


def test_bad_quant_and_missing_model_are_one_line_errors(tmp_path):
    with pytest.raises(SystemExit, match="--quant: quantization must be one of"):
        _run("--prompt", "x", "--quant", "int3")
    with pytest.raises(SystemExit, match=r"--model .*: no checkpoint folder"):
        generate.main(["--model", str(tmp_path / "nope"), "--prompt", "x"])
