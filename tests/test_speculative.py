"""Speculative decoding (dispatch.serve): drafters, greedy acceptance, rollback, and the promise that
greedy speculative output is token-identical to plain greedy output in batch-invariant mode.

CPU: fp32; batch-invariant runs go through Triton's interpreter (short generations). References are
plain Python loops written from the definitions. GPU (marker ``gpu``): the shipped model in bf16
under CUDA graphs.
"""
import random

import pytest
import torch

from dispatch.engine import Engine, LeanModel
from dispatch.hf import tiny_model
from dispatch.serve.acceptance import greedy_accept, leading
from dispatch.serve.drafters import DraftModel, PromptLookup, lookup
from dispatch.serve.speculative import SpeculativeEngine, advance


def lookup_loop(tokens: list[int], last: int, k: int, n_max: int, n_min: int) -> list[int]:
    """Prompt lookup from its definition: longest n first, latest match ending before ``last``."""
    text = tokens[:last + 1]
    for n in range(n_max, n_min - 1, -1):
        if n > len(text) - 1:
            continue
        suffix = text[-n:]
        starts = [w for w in range(len(text) - n) if text[w:w + n] == suffix and w + n <= last]
        if starts:
            src = starts[-1] + n
            out = []
            for _ in range(k):  # copy, and keep copying from the copy
                out.append((text + out)[src + len(out)])
            return out
    return [text[-1]] * k


def test_lookup_worked_example():
    hist = torch.tensor([[1, 2, 3, 1, 2, 0, 0, 0]])
    assert lookup(hist, torch.tensor([4]), 5, 2, 1).tolist() == [[3, 1, 2, 3, 1]]
    assert lookup(hist, torch.tensor([2]), 3, 2, 1).tolist() == [[3, 3, 3]]  # no earlier 3: the last token
    assert lookup(hist, torch.tensor([4]), 0).shape == (1, 0)


@pytest.mark.parametrize("seed", range(6))
def test_lookup_matches_its_definition(seed):
    rnd = random.Random(seed)
    V, S, B = rnd.choice([2, 3, 5]), 24, 7
    rows = [[rnd.randrange(V) for _ in range(S)] for _ in range(B)]
    last = [rnd.randrange(S) for _ in range(B)]
    hist = torch.tensor(rows)
    garbage = hist.clone()
    for b in range(B):  # what lies past a row's last token must never matter
        garbage[b, last[b] + 1:] = 99
    for n_max, n_min in ((3, 1), (2, 2), (4, 2)):
        for k in (1, 4, 7):
            got = lookup(hist, torch.tensor(last), k, n_max, n_min)
            assert got.tolist() == [lookup_loop(rows[b], last[b], k, n_max, n_min) for b in range(B)]
            assert torch.equal(lookup(garbage, torch.tensor(last), k, n_max, n_min), got)


def test_greedy_accept_worked_example_and_loop():
    logits = torch.full((1, 4, 10), -1.0)
    for j, t in enumerate([5, 7, 9, 4]):
        logits[0, j, t] = 1.0
    out, n = greedy_accept(torch.tensor([[5, 7, 2]]), logits)
    assert out.tolist() == [[5, 7, 9, 4]] and n.tolist() == [2]
    g = torch.Generator().manual_seed(0)
    for k in (0, 1, 3, 6):
        logits = torch.randn(50, k + 1, 3, generator=g)
        drafts = torch.randint(0, 3, (50, k), generator=g)
        out, n = greedy_accept(drafts, logits)
        t = logits.argmax(-1)
        for b in range(50):
            want = next((j for j in range(k) if drafts[b, j] != t[b, j]), k)
            assert n[b] == want and out[b].tolist() == t[b].tolist()
    assert leading(torch.tensor([[True, False, True], [True, True, True], [False, True, True]])).tolist() == [1, 3, 0]
    with pytest.raises(ValueError, match="k\\+1"):
        greedy_accept(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, 5))


def test_advance_is_the_rollback():
    hist = torch.arange(20).reshape(2, 10)
    pos, cap = torch.tensor([3, 6]), torch.tensor([9, 7])
    out = torch.tensor([[50, 51, 52], [60, 61, 62]])
    adv = advance(hist, pos, out, torch.tensor([1, 2]), cap)
    assert adv.tolist() == [2, 1] and pos.tolist() == [5, 7]  # row 1 stops at its cap
    assert hist[0].tolist() == [0, 1, 2, 3, 50, 51, 6, 7, 8, 9]  # the rejected 52 is not written
    assert hist[1].tolist() == [10, 11, 12, 13, 14, 15, 16, 60, 18, 19]
    assert advance(hist, pos, out, torch.tensor([2, 2]), cap).tolist() == [3, 0]  # a row at its cap stays


def _ids(tok, texts):
    return [tok(t)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def shipped():
    from dispatch.train import load

    return load("cpu")


CODE = ["class Path:\n    def __init__(self, path):\n        self.path = path\n\n    def exists(self):\n"
        "        return ",
        "import os\nimport sys\nimport re\nimport io\nimport os\nimport "]


def test_prompt_lookup_greedy_is_plain_greedy_batch_invariant(shipped):
    """The promise of chapter 9, on the shipped model (Triton's interpreter): token-identical output."""
    ids, n = _ids(shipped.tokenizer, CODE), 7  # the second prompt's first kept draft comes at its 6th token
    plain = Engine(shipped.model, max_batch=2, max_seq=96, batch_invariant=True).generate(ids, n)
    spec = SpeculativeEngine(shipped.model, PromptLookup(), k=4, max_batch=2, max_seq=96, batch_invariant=True)
    out = spec.generate(ids, n)
    assert out.tokens == plain.tokens and all(len(t) == n for t in out.tokens)
    acc = out.extra["accepted"]
    assert len(acc) == out.decode_steps and sum(map(sum, acc)) > 0  # drafts were kept
    for b in range(2):  # every step emitted its kept drafts and one token of the target's own
        assert 1 + sum(a[b] + 1 for a in acc) >= n


def test_draft_model_greedy_is_plain_greedy_batch_invariant():
    """A draft model equal to the target drafts the target's own tokens: every draft is kept; with
    another model as draft, the output is still plain greedy's. One layer: a second repeats its kernels."""
    model, other = (tiny_model("olmoe", seed=s, num_hidden_layers=1)[1] for s in (0, 1))
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 9)]
    plain = Engine(model, max_batch=2, max_seq=32, batch_invariant=True).generate(prompts, 9).tokens
    same = SpeculativeEngine(model, DraftModel(model), k=3, max_batch=2, max_seq=32, batch_invariant=True)
    out = same.generate(prompts, 9)
    assert out.tokens == plain and out.extra["accepted"][:2] == [[3, 3], [3, 3]]
    spec = SpeculativeEngine(model, DraftModel(other), k=2, max_batch=2, max_seq=32, batch_invariant=True)
    assert spec.generate(prompts, 9).tokens == plain


def test_stop_tokens_and_lengths(shipped):
    """Rows stop at their stop token or at max_new_tokens, even inside a step that emitted more."""
    ids = _ids(shipped.tokenizer, CODE + ["x = 1\n"])
    spec = SpeculativeEngine(shipped.model, PromptLookup(), k=5, max_batch=4, max_seq=128)
    full = spec.generate(ids, 30).tokens
    plain = Engine(shipped.model, max_batch=4, max_seq=128).generate(ids, 30).tokens
    assert [len(t) for t in full] == [30, 30, 30]
    stop = full[0][7]
    cut = spec.generate(ids, 30, stop_tokens=(stop,)).tokens
    for row, ref in zip(cut, plain, strict=True):
        want = ref[:ref.index(stop) + 1] if stop in ref else ref
        assert row == want
    assert [len(t) for t in spec.generate(ids, 1).tokens] == [1, 1, 1]


def test_rejects_bad_setups(shipped):
    with pytest.raises(ValueError, match="k \\(the most drafts"):
        SpeculativeEngine(shipped.model, PromptLookup(), k=0)
    with pytest.raises(ValueError, match="vocabulary"):
        SpeculativeEngine(shipped.model, DraftModel(tiny_model("olmoe")[1]), k=2)
    with pytest.raises(ValueError, match="lean forward"):
        SpeculativeEngine(tiny_model("deepseek_v3")[1], PromptLookup())
    with pytest.raises(ValueError, match="n_min"):
        PromptLookup(n_max=1, n_min=2)
    spec = SpeculativeEngine(shipped.model, PromptLookup(), k=2, max_seq=16)
    with pytest.raises(ValueError, match="max_seq"):
        spec.generate([[1] * 10], 10)
    with pytest.raises(ValueError, match="max_new_tokens"):
        spec.generate([[1]], 0)
    assert isinstance(spec.model, LeanModel)


@pytest.mark.gpu
@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_gpu_speculative_greedy_is_plain_greedy(drafter):
    """bf16, CUDA graphs, batch-invariant mode: token-identical to the plain engine on every prompt."""
    from dispatch.train import load

    ck = load("cpu", device="cuda")
    d = PromptLookup() if drafter == "lookup" else DraftModel(load("draft", device="cuda").model)
    ids = _ids(ck.tokenizer, CODE * 3)
    plain = Engine(ck.model, max_batch=8, max_seq=160, batch_invariant=True).generate(ids, 64).tokens
    spec = SpeculativeEngine(ck.model, d, k=4, max_batch=8, max_seq=160, batch_invariant=True)
    assert spec.graphs
    assert spec.generate(ids, 64).tokens == plain
    assert spec.generate(ids[:1], 64).tokens == plain[:1]
