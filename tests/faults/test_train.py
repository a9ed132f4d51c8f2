"""dispatch.train on bad input: nothing that is not ours is destroyed, and a non-finite loss or
coefficient stops training with an error that names it (the checkpoint already there stays)."""
import dataclasses

import pytest
import torch
from tokenizers import Tokenizer, models

from dispatch import checkpoint, train

MICRO = dataclasses.replace(train.PRESETS["micro"], threads=1)


def _save(dest, **kw):
    log = {"config": dataclasses.asdict(MICRO), "curves": {}}
    return train.save(train.build_model(MICRO), None, log, Tokenizer(models.BPE()), dest, {"hash": "x"}, **kw)


def test_out_refuses_a_plain_file(tmp_path):
    """Was: the file was deleted and replaced by a checkpoint folder."""
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    with pytest.raises(SystemExit, match="is a file, not a checkpoint folder.*--force"):
        train.main(["--preset", "micro", "--out", str(f)])  # refused before the corpus is read
    assert f.read_text() == "mine"
    with pytest.raises(FileExistsError, match="is a file"):
        _save(f)
    assert f.read_text() == "mine"


def test_out_refuses_a_folder_that_is_not_a_checkpoint(tmp_path):
    """Was: the folder and its notes.txt were removed."""
    d = tmp_path / "work"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(SystemExit, match=r"not a checkpoint written by dispatch.*holds notes\.txt"):
        train.main(["--preset", "micro", "--out", str(d)])
    with pytest.raises(FileExistsError, match="notes.txt"):
        _save(d)
    assert (d / "notes.txt").read_text() == "mine"


def test_force_replaces_and_a_checkpoint_or_empty_folder_is_replaced_without_it(tmp_path):
    d = tmp_path / "work"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    _save(d, force=True)
    assert checkpoint.is_checkpoint(d) and not (d / "notes.txt").exists()
    _save(d)  # our own checkpoint: replaced
    empty = tmp_path / "empty"
    empty.mkdir()
    _save(empty)
    assert checkpoint.verify(empty)


def test_non_finite_coefficients_are_refused_before_training():
    """Was: --aux-coef nan trained, exited 0 and saved 14 tensors of NaN."""
    for name in ("aux_coef", "z_coef", "bias_rate", "lr", "weight_decay"):
        for v in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match=f"TrainConfig.{name} must be a finite number"):
                dataclasses.replace(MICRO, **{name: v})
    with pytest.raises(SystemExit) as e:
        train.main(["--preset", "micro", "--aux-coef", "nan", "--out", "/nonexistent/never"])
    assert e.value.code == 2  # argparse's usage error, naming the field


def test_a_non_finite_loss_stops_training_and_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    """A learning rate that blows the weights up: the step whose loss or gradient is not finite stops
    the run with FloatingPointError before any weight takes it, and --out keeps what it held."""
    ids = torch.randint(1, MICRO.vocab_size, (2000,), generator=torch.Generator().manual_seed(0))
    cfg = dataclasses.replace(MICRO, lr=1e30, warmup=1, steps=20, z_coef=0.0)
    with pytest.raises(FloatingPointError, match=r"training stopped at step \d+: .*not updated and nothing was saved"):
        train.train(cfg, ids[:1500], ids[1500:], progress=False)
    dest = tmp_path / "ck"
    _save(dest)
    before = {p.name: p.read_bytes() for p in dest.iterdir()}

    class Tok:  # run() without the stdlib corpus: a stand-in tokenizer and split
        pass
    monkeypatch.setattr(train.data, "manifest", lambda: {"hash": "x", "files": []})
    monkeypatch.setattr(train.data, "tokenizer", lambda v: Tok())
    monkeypatch.setattr(train.data, "encode_split", lambda tok, split: ids[:1500] if split == "train" else ids[1500:])
    with pytest.raises(FloatingPointError):
        train.run(cfg, dest, command="test", progress=False)
    assert {p.name: p.read_bytes() for p in dest.iterdir()} == before


def test_save_refuses_non_finite_weights(tmp_path):
    m = train.build_model(MICRO)
    with torch.no_grad():
        next(m.parameters())[0, 0] = float("nan")
    with pytest.raises(ValueError, match="holds inf or NaN"):
        train.save(m, None, {"config": dataclasses.asdict(MICRO)}, Tokenizer(models.BPE()), tmp_path / "ck", {})
    assert not (tmp_path / "ck").exists()
