"""Checkpoint folders on bad input: a folder without hashes.json loads with a warning (refused under
strict=True), a broken hashes.json or an empty folder says what is wrong, and a mistyped local path
is never sent to the network for half a minute."""
import dataclasses
import json
import shutil
import time
import warnings

import pytest
from tokenizers import Tokenizer, models

from dispatch import checkpoint, train

MICRO = dataclasses.replace(train.PRESETS["micro"], threads=1)


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    out = tmp_path_factory.mktemp("ck") / "ck"
    train.save(train.build_model(MICRO), None, {"config": dataclasses.asdict(MICRO), "curves": {}},
               Tokenizer(models.BPE()), out, {"hash": "x", "files": []})
    return out


def _flip_a_weight_bit(folder):
    raw = bytearray((folder / "model.safetensors").read_bytes())
    raw[-5] ^= 0x40  # an exponent bit of the last weight
    (folder / "model.safetensors").write_bytes(bytes(raw))


def test_no_hashes_json_loads_with_a_warning_or_is_refused_under_strict(ck, tmp_path):
    """Was: a folder without hashes.json, one weight bit flipped, loaded silently (logits off by 2.8e37)."""
    dest = tmp_path / "ck"
    shutil.copytree(ck, dest)
    (dest / checkpoint.HASH_FILE).unlink()
    _flip_a_weight_bit(dest)
    with pytest.warns(checkpoint.UnverifiedWarning, match="no hashes.json: its weights cannot be verified"):
        train.load(dest, device="cpu")
    with pytest.raises(ValueError, match="strict=True refuses it"):
        train.load(dest, device="cpu", strict=True)


def test_a_verified_checkpoint_loads_without_a_warning(ck):
    with warnings.catch_warnings():
        warnings.simplefilter("error", checkpoint.UnverifiedWarning)
        train.load(ck, device="cpu", strict=True)


def test_hashes_json_that_is_not_json_names_the_file(ck, tmp_path):
    """Was: a raw JSONDecodeError."""
    dest = tmp_path / "ck"
    shutil.copytree(ck, dest)
    (dest / checkpoint.HASH_FILE).write_text("{truncated")
    with pytest.raises(ValueError, match=r"hashes.json is not valid JSON .*cannot be verified"):
        train.load(dest, device="cpu")
    (dest / checkpoint.HASH_FILE).write_text(json.dumps({"sha256": ["not", "a", "table"]}))
    with pytest.raises(ValueError, match='no "sha256" table'):
        train.load(dest, device="cpu")


def test_a_weights_file_added_after_saving_is_refused(ck, tmp_path):
    dest = tmp_path / "ck"
    shutil.copytree(ck, dest)
    shutil.copy(dest / "model.safetensors", dest / "model-00002.safetensors")
    with pytest.raises(ValueError, match="model-00002.safetensors not listed in hashes.json"):
        train.load(dest, device="cpu")


def test_an_empty_folder_says_it_is_not_a_checkpoint(tmp_path):
    """Was: transformers' 'Should have a model_type key in its config.json'."""
    with pytest.raises(FileNotFoundError, match="has no config.json: not a checkpoint folder"):
        train.load(tmp_path, device="cpu")


def test_a_missing_folder_under_an_existing_one_is_not_a_hub_id(tmp_path, monkeypatch):
    """Was: `ckpt/nope` was taken as a hub id and retried the network for 32 s."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpt").mkdir()
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match="no checkpoint folder at ckpt/nope"):
        train.load("ckpt/nope", device="cpu")
    assert time.time() - t0 < 2


def test_a_hub_id_the_hub_cannot_be_asked_for_fails_at_once(tmp_path, monkeypatch):
    """An owner/name that is no folder here, with the hub out of reach: one quick question, no retries."""
    import huggingface_hub

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))

    def unreachable(self, repo, **kw):
        raise ConnectionError("Name or service not known")
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match="not in the local cache and the hub cannot be reached"):
        train.load("someone/nope", device="cpu")
    assert time.time() - t0 < 2

    from huggingface_hub.errors import RepositoryNotFoundError

    def missing(self, repo, **kw):
        raise RepositoryNotFoundError.__new__(RepositoryNotFoundError)  # (its __init__ wants an HTTP response)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", missing)
    with pytest.raises(FileNotFoundError, match="the Hugging Face hub has no model 'someone/nope'"):
        train.load("someone/nope", device="cpu")
