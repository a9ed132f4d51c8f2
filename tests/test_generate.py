"""python -m dispatch.generate: the torch thread count it decodes with on CPU."""
import io
from types import SimpleNamespace

import pytest
import torch

from dispatch.generate import SMALL_MODEL_PARAMS, cpu_threads, main


def model_of(params: int):
    return SimpleNamespace(parameters=lambda: iter([torch.empty(1).expand(params)]))  # no memory behind it


def test_a_small_model_decodes_on_one_thread_a_large_one_on_the_default():
    assert cpu_threads(model_of(SMALL_MODEL_PARAMS - 1)) == 1
    assert cpu_threads(model_of(SMALL_MODEL_PARAMS)) == torch.get_num_threads()
    assert cpu_threads(model_of(10), "3") == 3
    with pytest.raises(ValueError, match="positive number"):
        cpu_threads(model_of(10), "0")


def test_the_cli_says_its_threads_and_leaves_the_process_as_it_was():
    before = torch.get_num_threads()
    buf = io.StringIO()
    rep = main(["--model", "cpu", "--prompt", "def ", "--max-new-tokens", "4"], out=buf)
    assert rep["threads"] == 1 and "cpu (1 thread)" in buf.getvalue()
    assert torch.get_num_threads() == before
    rep = main(["--model", "cpu", "--prompt", "def ", "--max-new-tokens", "2", "--threads", "2"], out=io.StringIO())
    assert rep["threads"] == 2 and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="--threads"):
        main(["--model", "cpu", "--prompt", "def ", "--threads", "none"], out=io.StringIO())


class _Tok:
    """A five-token vocabulary: 0 is special (end of text), 1 "(", 2 "():", 3 "(x", 4 "a"."""

    texts = ["<eot>", "(", "():", "(x", "a"]
    all_special_ids = [0]

    def __len__(self):
        return len(self.texts)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(self.texts[i] for i in ids)

    def convert_ids_to_tokens(self, ids):
        return [self.texts[i] for i in ids]


def test_heal_picks_among_the_tokens_that_start_with_the_last_ones_text():
    from dispatch.engine import SamplingParams
    from dispatch.generate import heal

    seen = []

    def last_logits(prefix):  # "a" and the special token score highest: neither starts with "("
        seen.append(prefix)
        return torch.tensor([9.0, 1.0, 3.0, 2.0, 8.0])

    prompts, tail = heal(last_logits, _Tok(), [4, 1], SamplingParams(), rows=2)
    assert seen == [[4]] and tail == "(" and prompts == [[4, 2], [4, 2]]
    assert heal(last_logits, _Tok(), [1], SamplingParams()) is None  # one token: nothing to back up onto
    assert heal(last_logits, _Tok(), [1, 4], SamplingParams()) is None  # no other token starts with "a"
    draws = [heal(last_logits, _Tok(), [4, 1], SamplingParams(1.0, 1.0, seed), rows=8)[0] for seed in (0, 0, 1)]
    assert draws[0] == draws[1] and all(p[-1] in (1, 2, 3) for p in draws[0] + draws[2])


def test_the_showcase_prompt_is_healed_and_its_greedy_text_does_not_loop():
    """``def main(`` ends in "(", which byte-pair encoding merges into "():" in training: unhealed, the
    model continues with arguments; healed, it writes the function. The first 64 greedy tokens hold no
    block of 1-16 tokens repeated three times in a row, anywhere."""
    from dispatch_book.demo import first_loop

    rep = main(["--prompt", "def main(", "--max-new-tokens", "64"], out=io.StringIO())
    assert rep["healed"] == ["(", "():"] and rep["texts"][0].startswith("):")
    assert rep["new_tokens"] == [64] and first_loop(rep["tokens"][0]) is None
    assert first_loop([5, 1, 2, 1, 2, 1, 2, 7]) == (7, 2) and first_loop([1, 2, 3, 1, 2, 3, 1, 2]) is None
    plain = main(["--prompt", "def main(", "--max-new-tokens", "4", "--no-heal"], out=io.StringIO())
    assert plain["healed"] is None and not plain["texts"][0].startswith(")")
    one = io.StringIO()
    assert main(["--prompt", "def main(", "--max-new-tokens", "1"], out=one)["new_tokens"] == [1]
    assert one.getvalue().startswith("def main():\n[the healed token was the one new token")
