"""The demo's two measures (dispatch_book/demo.py) on hand-made cases, and the prompts it draws."""
import pytest

from dispatch_book import demo


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
