"""The data helpers validate their sizes and ids where they enter; a tokenizer is never trained
silently on nothing, and one enormous word cannot stall BPE training for minutes."""
import math
import time

import pytest
import torch

from dispatch import data


def _corpus(root, texts):
    root.mkdir()
    for i, t in enumerate(texts):
        (root / f"m{i:02d}.py").write_text(t)
    return root


def test_tokenizer_on_empty_files_is_an_error(tmp_path):
    """Was: a 257-token vocabulary, silently."""
    root = _corpus(tmp_path / "lib", [""] * 12)
    with pytest.raises(ValueError, match="holds no text .*11 files, all empty"):
        data.train_tokenizer(1000, root)


def test_tokenizer_too_small_a_corpus_warns(tmp_path):
    root = _corpus(tmp_path / "lib", ["def f(x):\n    return x\n"] * 12)
    with pytest.warns(UserWarning, match=r"yields only \d+ tokens of the 1000 asked for"):
        data.train_tokenizer(1000, root)


def test_one_enormous_word_trains_in_seconds(tmp_path):
    """Was: one 1M-character word ran BPE training for more than 4 minutes (time grows as its square)."""
    g = torch.Generator().manual_seed(0)
    word = "".join("abcdefghij"[i] for i in torch.randint(0, 10, (1_000_000,), generator=g).tolist())
    root = _corpus(tmp_path / "lib", [word] + ["def f(x):\n    return x\n"] * 11)
    t0 = time.time()
    tok = data.train_tokenizer(400, root)
    assert time.time() - t0 < 60 and tok.get_vocab_size() == 400
    assert list(data._bounded(["ab " + "x" * 2500 + " cd"])) == ["ab ", "x" * 1000, "x" * 1000, "x" * 500, " cd"]
    assert list(data._bounded(["no long run"])) == ["no long run"]


def test_unigram_perplexity_refuses_ids_outside_the_vocabulary():
    """Was: a negative id wrapped around to the last token's probability."""
    with pytest.raises(ValueError, match=r"val_ids must lie in \[0, vocab_size=4\), got ids from -1 to 2"):
        data.unigram_perplexity(torch.tensor([0, 1, 2]), torch.tensor([-1, 2]), 4)
    with pytest.raises(ValueError, match="train_ids must lie in"):
        data.unigram_perplexity(torch.tensor([0, 9]), torch.tensor([1]), 4)
    with pytest.raises(ValueError, match="val_ids is empty"):
        data.unigram_perplexity(torch.tensor([0, 1]), torch.tensor([], dtype=torch.long), 4)
    assert math.isfinite(data.unigram_perplexity(torch.tensor([0, 1]), torch.tensor([3]), 4))


@pytest.mark.parametrize("kw", [{"seq_len": 0, "batch_size": 2}, {"seq_len": 4, "batch_size": 0},
                                {"seq_len": -3, "batch_size": 2}, {"seq_len": 4, "batch_size": 2.0}])
def test_batches_refuse_sizes_below_one_when_called(kw):
    """Was: empty batches, forever."""
    with pytest.raises(ValueError, match="must be a positive int"):
        data.batches(torch.arange(100), seed=0, **kw)  # at the call, not at the first next()


@pytest.mark.parametrize("seq_len, max_tokens", [(0, 64), (-1, 64), (8, 0)])
def test_windows_refuse_sizes_below_one(seq_len, max_tokens):
    """Was: ZeroDivisionError for seq_len=0."""
    with pytest.raises(ValueError, match="must be a positive int"):
        data.windows(torch.arange(100), seq_len, max_tokens)


def test_ids_must_be_one_dimensional_integers():
    with pytest.raises(ValueError, match="1-D integer tensor"):
        data.windows(torch.zeros(100), 8, 64)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        data.batches(torch.arange(100).view(10, 10), 4, 2, seed=0)
