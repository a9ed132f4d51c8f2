"""The router hooks against hand-written references on transformers' own OLMoE block; a smoke train."""
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

import dispatch  # noqa: F401
from dispatch import routertap, train
from dispatch.hf import moe_blocks

MICRO = train.PRESETS["micro"]


@pytest.fixture(scope="module")
def model():
    return train.build_model(MICRO).eval()


def block_reference(block, x_TH, keep_TK=None, ids_TK=None, weights_TK=None):
    """y_TH = Σ_k keep · weight · SwiGLU expert(x), written out token by token."""
    logits = x_TH @ block.gate.weight.t()
    probs = torch.softmax(logits.float(), -1)
    if ids_TK is None:
        weights_TK, ids_TK = torch.topk(probs, block.gate.top_k, dim=-1)
    ex = block.experts
    I = ex.intermediate_dim
    y = torch.zeros_like(x_TH)
    for t in range(x_TH.shape[0]):
        for k in range(ids_TK.shape[1]):
            if keep_TK is not None and not keep_TK[t, k]:
                continue
            e = int(ids_TK[t, k])
            gu = ex.gate_up_proj[e] @ x_TH[t]
            h = F.silu(gu[:I]) * gu[I:]
            y[t] += weights_TK[t, k] * (ex.down_proj[e] @ h)
    return y


def keep_by_hand(ids_TK, E, cf):
    """Capacity ceil(cf·T·K/E) per expert; first choices of all tokens before second choices."""
    T, K = ids_TK.shape
    if cf is None:
        return torch.ones(T, K, dtype=torch.bool)
    cap, used = math.ceil(cf * T * K / E), [0] * E
    keep = torch.zeros(T, K, dtype=torch.bool)
    for k in range(K):
        for t in range(T):
            e = int(ids_TK[t, k])
            keep[t, k], used[e] = used[e] < cap, used[e] + (used[e] < cap)
    return keep


@pytest.mark.parametrize("cf", [None, 2.0, 1.0, 0.5])
def test_capacity_hook_matches_reference(model, cf):
    block = next(moe_blocks(model))[1]
    x = torch.randn(24, MICRO.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), routertap.RouterTap(model, capacity_factor=cf) as tap:
        y = block(x[None])[0]
    ids = tap.ids_L[0]
    keep = keep_by_hand(ids, MICRO.num_experts, cf)  # not capacity_keep_mask: the hook calls that itself
    assert torch.equal(tap.keep_L[0], keep)
    with torch.no_grad():
        ref = block_reference(block, x, keep_TK=keep)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    assert tap.dropped_L[0] == int((~keep).sum()) and tap.pairs_L[0] == ids.numel()
    assert tap.counts_LE[0].sum().item() == int(keep.sum())
    if cf is None:
        with torch.no_grad():
            assert torch.equal(y, block(x[None])[0])  # dropless hook = transformers' block untouched


def test_bias_hook_chooses_with_bias_weights_without(model):
    block = next(moe_blocks(model))[1]
    x = torch.randn(10, MICRO.hidden_size, generator=torch.Generator().manual_seed(1))
    bias = torch.zeros(1, MICRO.num_experts)
    bias[0, 3] = 10.0  # expert 3 wins every token's first choice
    with torch.no_grad(), routertap.RouterTap(model, bias_LE=bias) as tap:
        y = block(x[None])[0]
    ids = tap.ids_L[0]
    assert (ids[:, 0] == 3).all()
    probs = torch.softmax(x @ block.gate.weight.t(), -1)
    with torch.no_grad():
        ref = block_reference(block, x, ids_TK=ids, weights_TK=probs.gather(1, ids))
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="bias_LE"):
        routertap.RouterTap(model, bias_LE=torch.zeros(2, 2))


def test_evaluate_matches_transformers_loss(model):
    win = torch.randint(0, MICRO.vocab_size, (3, MICRO.seq_len + 1), generator=torch.Generator().manual_seed(2))
    out = routertap.evaluate(model, win, batch_size=2, keep_routes=True)
    with torch.no_grad():
        hf = model(input_ids=win, labels=win).loss.item()  # transformers shifts labels itself
    assert out["ppl"] == pytest.approx(math.exp(hf), rel=1e-4)
    assert out["dropped"] == 0.0 and out["tokens"] == 3 * MICRO.seq_len
    assert out["ids_LTK"].shape == (1, 3 * MICRO.seq_len, MICRO.top_k)
    assert out["counts_LE"].sum().item() == 3 * MICRO.seq_len * MICRO.top_k
    dropped = routertap.evaluate(model, win, batch_size=2, capacity_factor=0.5)
    assert dropped["dropped"] >= 0.5 - 1e-9  # capacity 0.5 × mean load keeps at most half


@pytest.mark.parametrize("mode", ["aux", "bias", "none"])
def test_smoke_train_save_load(tmp_path, mode):
    cfg = dataclasses.replace(MICRO, balance=mode, threads=1, bias_rate=0.05)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, cfg.vocab_size, (2000,), generator=g)
    m, bias, log = train.train(cfg, ids[:1500], ids[1500:], progress=False)
    assert log["curves"]["step"] == [1, 2, 3] and all(math.isfinite(x) for x in log["curves"]["loss"])
    assert (bias is not None) == (mode == "bias")
    if mode == "bias":  # three steps of ±0.05 (or 0): bias on the grid, sums of signs
        assert torch.all((bias / 0.05 - (bias / 0.05).round()).abs() < 1e-4) and bias.abs().max() > 0
    from tokenizers import Tokenizer, models
    tok = Tokenizer(models.BPE())
    log.update(config=dataclasses.asdict(cfg))
    train.save(m, bias, log, tok, tmp_path / "ck", {"hash": "x", "files": []})
    back = train.load(tmp_path / "ck", device="cpu")
    x = ids[None, :16]
    with torch.no_grad():
        torch.testing.assert_close(back.model(input_ids=x).logits, m(input_ids=x).logits)
    assert back.log["config"]["balance"] == mode
    if mode == "bias":
        assert torch.equal(back.bias_LE, bias)
    else:
        assert back.bias_LE is None


def test_max_seconds_ends_training_after_the_step_that_crosses_it():
    cfg = dataclasses.replace(MICRO, steps=50, threads=1, max_seconds=1e-9)
    ids = torch.randint(1, cfg.vocab_size, (2000,), generator=torch.Generator().manual_seed(0))
    _, _, log = train.train(cfg, ids[:1500], ids[1500:], progress=False)
    assert log["steps_done"] == 1 and log["curves"]["step"] == [1] and log["curves"]["eval_step"] == [1]


def test_config_validation():
    with pytest.raises(ValueError, match="balance"):
        dataclasses.replace(MICRO, balance="magic")
    for bad in (0, -1.0, float("inf"), True, "10"):
        with pytest.raises(ValueError, match="max_seconds"):
            dataclasses.replace(MICRO, max_seconds=bad)
    with pytest.raises(ValueError, match="top_k"):
        dataclasses.replace(MICRO, top_k=9)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory):
    """A micro checkpoint saved through train.save (no training: a fresh model)."""
    from tokenizers import Tokenizer, models

    cfg = dataclasses.replace(MICRO, threads=1)
    m = train.build_model(cfg)
    out = tmp_path_factory.mktemp("ck") / "ck"
    log = {"config": dataclasses.asdict(cfg), "curves": {}}
    train.save(m, None, log, Tokenizer(models.BPE()), out, {"hash": "x", "files": []})
    return out


def test_save_records_hashes_and_replaces_a_checkpoint_whole(checkpoint_dir, tmp_path):
    import json
    import shutil

    from tokenizers import Tokenizer, models

    from dispatch import checkpoint

    hashes = json.loads((checkpoint_dir / checkpoint.HASH_FILE).read_text())["sha256"]
    assert {"model.safetensors", "config.json", "train_log.json", "manifest.json"} <= set(hashes)
    dest = tmp_path / "ck"
    shutil.copytree(checkpoint_dir, dest)
    (dest / "stale.txt").write_text("from an older run")
    before = sorted(p.name for p in dest.iterdir())

    import pathlib

    class Exploding(torch.nn.Module):  # fails halfway through writing
        def to(self, *a, **k):
            return self

        def save_pretrained(self, d):
            (pathlib.Path(d) / "model.safetensors").write_bytes(b"half")
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        train.save(Exploding(), None, {"config": dataclasses.asdict(MICRO)}, Tokenizer(models.BPE()), dest, {})
    assert sorted(p.name for p in dest.iterdir()) == before, "a failed save leaves the old checkpoint as it was"
    assert [p.name for p in tmp_path.iterdir()] == ["ck"], "no temporary folder left behind"
    checkpoint.verify(dest)
    m = train.build_model(MICRO)
    train.save(m, None, {"config": dataclasses.asdict(MICRO)}, Tokenizer(models.BPE()), dest, {})
    assert not (dest / "stale.txt").exists(), "a new save replaces the folder whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_load_refuses_flipped_bytes(checkpoint_dir, tmp_path):
    import shutil

    dest = tmp_path / "ck"
    shutil.copytree(checkpoint_dir, dest)
    train.load(dest, device="cpu")  # intact: loads
    raw = bytearray((dest / "model.safetensors").read_bytes())
    raw[-5] ^= 0xFF
    (dest / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="model.safetensors does not match"):
        train.load(dest, device="cpu")


@pytest.mark.parametrize("name", ["cpu", "draft", "demo"])
def test_committed_checkpoint_verifies(name):
    from dispatch import checkpoint

    if name == "demo" and not (train.ASSETS / name).is_dir():
        pytest.skip("no demo model committed (dispatch_book/gpu/demo_train.sh trains it)")
    assert checkpoint.verify(train.ASSETS / name, strict=True)


@pytest.mark.parametrize("source", ["/no/such/checkpoint", "./runs/missing", "a/b/c", "~/nothing-here"])
def test_load_of_a_missing_local_path_fails_at_once(source, monkeypatch):
    import pathlib
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        train.load(source, device="cpu")
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        train.load(pathlib.Path("runs") / "x", device="cpu")
    assert time.time() - t0 < 5


def test_load_of_a_preset_without_checkpoint_says_how_to_train_it():
    with pytest.raises(FileNotFoundError, match="--preset gpu"):
        train.load("gpu", device="cpu")


def test_cli_documents_only_flags_that_exist():
    import re

    flags = set(re.findall(r"(--[a-z][a-z-]*)", train.__doc__))
    parser_flags = {"--preset", "--balance", "--aux-coef", "--z-coef", "--bias-rate", "--steps", "--seed",
                    "--threads", "--max-seconds", "--out", "--force"}
    assert flags <= parser_flags, flags - parser_flags
    with pytest.raises(SystemExit):
        train.main(["--device", "cuda"])
