"""Chapter 9's exercise checks refuse the typical wrong answers (an n-gram drafter; greedy acceptance
with the rollback), so a reader who passes has the idea, not a near miss."""
import pathlib
import sys
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))  # exercises/ lives in the repository

from exercises import _checks  # noqa: E402
from exercises.solutions import ch09_accept, ch09_ngram  # noqa: E402


def _draft(tokens, k, n, *, latest=True, self_match=False, periodic=True, shift=0):
    L = len(tokens)
    if L < n + 1:
        return []
    last = L - n if self_match else L - n - 1
    order = range(last, -1, -1) if latest else range(0, last + 1)
    for i in order:
        if tokens[i:i + n] == tokens[-n:]:
            src = i + n - shift
            if not periodic:
                return tokens[src:src + k]
            return [tokens[src + j % (L - src)] for j in range(k)]
    return []


NGRAM_WRONG = {
    "the earliest match": lambda t, k, n: _draft(t, k, n, latest=False),
    "the suffix matching itself": lambda t, k, n: _draft(t, k, n, self_match=True, periodic=False),
    "a copy that stops at the end": lambda t, k, n: _draft(t, k, n, periodic=False),
    "off by one (the match's last token first)": lambda t, k, n: _draft(t, k, n, shift=1),
    "None for no match": lambda t, k, n: _draft(t, k, n) if len(t) > n and _draft(t, k, n) else None,
}


@pytest.mark.parametrize("what", NGRAM_WRONG)
def test_ngram_check_refuses(what):
    with pytest.raises(AssertionError):
        _checks.ch09_ngram(SimpleNamespace(ngram_draft=NGRAM_WRONG[what]))


def test_ngram_check_passes_the_solution_and_the_docstring_example():
    _checks.ch09_ngram(ch09_ngram)
    assert ch09_ngram.ngram_draft([7, 1, 2, 3, 1, 2], 4, 2) == [3, 1, 2, 3]


def _every_match(drafts, logits):
    out = logits.argmax(-1)
    return out, (drafts == out[:, :-1]).long().sum(1)  # counts past the first refusal


def _write_all(hist, pos, out, n):
    j = torch.arange(out.shape[1])[None, :]
    hist.scatter_(1, pos[:, None] + 1 + j, out)  # the rejected tail too
    pos.add_(n + 1)


def _no_bonus(hist, pos, out, n):
    ch09_accept.advance(hist, pos, out, n)
    pos.sub_(1)  # forgets the target's own token


def _host_loop(hist, pos, out, n):
    for b, (p, m) in enumerate(zip(pos.tolist(), n.tolist(), strict=True)):
        hist[b, p + 1:p + m + 2] = out[b, :m + 1]
    pos.add_(n + 1)


def _new_tensor(hist, pos, out, n):
    ch09_accept.advance(hist, pos.clone(), out, n)


ACCEPT_WRONG = {
    "counting every match, not the leading ones": dict(greedy_accept=_every_match, advance=ch09_accept.advance),
    "writing the rejected tail": dict(greedy_accept=ch09_accept.greedy_accept, advance=_write_all),
    "forgetting the target's own token": dict(greedy_accept=ch09_accept.greedy_accept, advance=_no_bonus),
    "a loop over rows on the host": dict(greedy_accept=ch09_accept.greedy_accept, advance=_host_loop),
    "positions not moved in place": dict(greedy_accept=ch09_accept.greedy_accept, advance=_new_tensor),
}


@pytest.mark.parametrize("what", ACCEPT_WRONG)
def test_accept_check_refuses(what):
    with pytest.raises(AssertionError):
        _checks.ch09_accept(SimpleNamespace(**ACCEPT_WRONG[what]))


def test_accept_check_passes_the_solution():
    _checks.ch09_accept(ch09_accept)
