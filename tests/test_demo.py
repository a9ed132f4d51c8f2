"""The demo's two measures (dispatch_book/demo.py) on hand-made cases, the prompts it draws, and the
demo model where it is committed (dispatch/assets/demo)."""
import json

import pytest

from dispatch import train
from dispatch_book import demo

DEMO = train.ASSETS / "demo"


@pytest.mark.parametrize("tokens,period", [
    ([1, 2, 3, 4, 5, 6], None),
    ([9, 7, 7, 7], 1),
    ([1, 2, 3, 4, 5, 6, 4, 5, 6, 4, 5, 6], 3),
    ([5, 6, 4, 5, 6, 4, 5, 6, 1], None),  # a loop that ended is no loop
    ([4, 5, 4, 5], None),  # two repeats are not three
    (list(range(17)) * 3, None),  # a period above MAX_PERIOD
    ([], None),
])
def test_loop_period(tokens, period):
    assert demo.loop_period(tokens) == period


def test_a_function_is_cut_where_its_indentation_ends():
    text = demo.function_text("    def f(x):", "\n        y = 1\n        return y\n    def g(self):", False)
    assert text == "def f(x):\n    y = 1\n    return y"
    assert demo.function_parses("    def f(x):", "\n        y = 1\n        return y\n    def g(self):", False)


def test_a_line_cut_by_the_token_limit_is_dropped_and_an_empty_body_fails():
    assert demo.function_text("def f(x):", "\n    y = 1\n    return (y", False) == "def f(x):\n    y = 1"
    assert demo.function_parses("def f(x):", "\n    y = 1\n    return (y", False)
    assert not demo.function_parses("def f(x):", "\n    return (y", False)  # nothing complete is left
    assert not demo.function_parses("def f(x):", "\n    return (y +\n", True)  # finished, but wrong
    assert not demo.function_parses("def f(x):", "\nclass A:", True)
    assert not demo.function_parses("def f(x):", "\n    # only a comment\n", True)


def test_the_prompts_are_held_out_defs_that_fit_the_context():
    from dispatch.train import load

    tok = load("cpu").tokenizer
    items = demo.prompts(tok, 5)
    assert len(items) == 5 and len({d for _, d in items}) == 5
    for ids, def_line in items:
        assert 0 < len(ids) <= demo.PROMPT_TOKENS and tok.decode(ids).endswith(def_line.strip())
    with pytest.raises(ValueError, match="fewer than --prompts"):
        demo.prompts(tok, 10**6)


def test_the_demo_runs_the_demo_model_where_it_ships():
    assert train.demo_model() == ("demo" if DEMO.is_dir() else "cpu")


def test_the_corpus_check_seeds_the_cache_with_the_shipped_tokenizer(tmp_path, monkeypatch):
    from dispatch import data

    want = json.loads((train.ASSETS / "cpu" / "manifest.json").read_text())["hash"]
    if data.manifest()["hash"] != want:
        with pytest.raises(SystemExit, match="DISPATCH_STDLIB"):
            demo.same_corpus()
        return
    monkeypatch.setenv("DISPATCH_CACHE", str(tmp_path))
    assert demo.same_corpus() == want
    assert json.loads(data.tokenizer(4096).to_str())["model"] == bpe("cpu")


def bpe(name: str) -> dict:
    """The BPE model (vocabulary and merges) of a committed checkpoint's tokenizer."""
    return json.loads((train.ASSETS / name / "tokenizer.json").read_text())["model"]


@pytest.mark.skipif(not DEMO.is_dir(), reason="no demo model committed (dispatch_book/gpu/demo_train.sh trains it)")
def test_the_shipped_demo_model_is_the_demo_preset_on_the_cpu_models_vocabulary():
    size = sum(p.stat().st_size for p in DEMO.iterdir())
    assert size <= 30 * 2**20, f"dispatch/assets/demo holds {size / 2**20:.1f} MiB"
    assert bpe("demo") == bpe("cpu")
    log = json.loads((DEMO / "train_log.json").read_text())
    cpu = json.loads((train.ASSETS / "cpu" / "train_log.json").read_text())
    assert log["manifest_hash"] == cpu["manifest_hash"]  # the same corpus
    preset = train.PRESETS["demo"]
    for key in ("hidden_size", "num_layers", "num_experts", "top_k", "vocab_size", "seq_len"):
        assert log["config"][key] == getattr(preset, key), key
    assert log["final"]["val_ppl"] > 0 and log["steps_done"] >= 1
