"""The corpus and tokenizer are named by hashes and rebuild identically."""
import math

import pytest
import torch

import dispatch  # noqa: F401
from dispatch import data


@pytest.fixture
def corpus(tmp_path):
    """A fake 'stdlib' of 12 files (so the split has one validation file: index 9)."""
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(12):
        (root / f"m{i:02d}.py").write_text(f"def f{i}(x):\n    return x * {i} + {i}  # module {i}\n" * 20)
    (root / "notes.txt").write_text("not python")
    return root


def test_manifest_sorted_split_by_file_and_hashed(corpus):
    m = data.manifest(corpus)
    names = [f["name"] for f in m["files"]]
    assert names == sorted(names) and len(names) == 12  # only *.py, sorted
    assert [f["name"] for f in m["files"] if f["split"] == "val"] == ["m09.py"]
    assert data.manifest(corpus)["hash"] == m["hash"]
    (corpus / "m03.py").write_text("changed = True\n")
    assert data.manifest(corpus)["hash"] != m["hash"]  # a different file → a visible difference


def test_manifest_of_this_python():
    m = data.manifest()
    assert len(m["files"]) > 50 and m["python"].count(".") == 2
    assert 0 < sum(f["split"] == "val" for f in m["files"]) < len(m["files"]) // 5


def test_dispatch_stdlib_names_the_corpus_folder(corpus, monkeypatch):
    monkeypatch.setenv("DISPATCH_STDLIB", str(corpus))
    assert data.stdlib_dir() == corpus and data.manifest()["hash"] == data.manifest(corpus)["hash"]
    assert len(data.split_texts("val")) == 1


def test_manifest_rejects_empty(tmp_path):
    with pytest.raises(ValueError, match=r"\*\.py"):
        data.manifest(tmp_path)


def test_tokenizer_deterministic_and_cached(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("DISPATCH_CACHE", str(tmp_path / "cache"))
    a = data.train_tokenizer(300, corpus).to_str()
    assert data.train_tokenizer(300, corpus).to_str() == a
    tok = data.tokenizer(300, corpus)
    cached = list((tmp_path / "cache").glob("bpe-*-300.json"))
    assert len(cached) == 1 and data.manifest(corpus)["hash"] in cached[0].name
    assert data.tokenizer(300, corpus).to_str() == tok.to_str() == a  # read back = rebuilt
    text = data.split_texts("val", corpus)[0]
    assert tok.decode(tok.encode(text).ids) == text  # byte-level: lossless
    ids = data.encode_split(tok, "val", corpus)
    assert ids[-1].item() == tok.token_to_id(data.SPECIAL) == 0


def test_unigram_perplexity_hand():
    # train counts [2, 1] + 1 → p = [0.6, 0.4]; val [0, 1]
    ppl = data.unigram_perplexity(torch.tensor([0, 0, 1]), torch.tensor([0, 1]), 2)
    assert ppl == pytest.approx(math.exp(-(math.log(0.6) + math.log(0.4)) / 2))


def test_windows_and_batches():
    ids = torch.arange(20)
    w = data.windows(ids, 4, 100)
    assert w.shape == (4, 5) and w[1, 0] == w[0, -1] == 4  # consecutive: each token predicted once
    assert data.windows(ids, 4, 9)[:, 0].tolist() == [0, 8]  # 2 of 4 windows, spread evenly
    b1, b2 = next(data.batches(ids, 4, 3, seed=7)), next(data.batches(ids, 4, 3, seed=7))
    assert torch.equal(b1, b2) and b1.shape == (3, 5)
    assert torch.equal(b1[:, 1:] - b1[:, :-1], torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="seq_len"):
        data.windows(ids, 30, 100)


def test_committed_tokenizer_rebuilds_identically():
    """The checkpoint's tokenizer.json is what training on this Python's stdlib produces now."""
    import json

    from dispatch import train

    ck = train.ASSETS / "cpu"
    log = json.loads((ck / "train_log.json").read_text())
    if log["manifest_hash"] != data.manifest()["hash"]:
        pytest.skip(f"this Python's stdlib differs from the checkpoint's ({log['python']})")
    committed = json.loads((ck / "tokenizer.json").read_text())["model"]
    fresh = json.loads(data.train_tokenizer(log["config"]["vocab_size"]).to_str())["model"]
    assert committed["vocab"] == fresh["vocab"] and committed["merges"] == fresh["merges"]
