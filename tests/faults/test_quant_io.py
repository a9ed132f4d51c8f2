"""quant.save / quant.load on bad input: every file carries a content hash that load verifies (an old
file without one loads with a warning, or is refused under strict=True); codes and scales are
range-checked; a folder, a stranger's file or a shared layer get messages that name them."""
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from dispatch import checkpoint, config, quant

_UNVERIFIED = getattr(checkpoint, "UnverifiedWarning", Warning)  # (so that this file runs on older code too)


def _layers(scheme="int8-channel"):
    w = config.random_weights(config.PRESETS["tiny"])
    return {0: quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)}


def _rewrite(path, edit, keep_hash=True):
    """Rewrite a quantized file with ``edit(tensors)`` applied (hash dropped unless keep_hash: stale)."""
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k).clone() for k in f.keys()}  # noqa: SIM118
    edit(tensors)
    if not keep_hash:
        meta.pop("sha256")
    save_file(tensors, str(path), metadata=meta)


def test_a_flipped_scale_bit_is_refused(tmp_path):
    """Was: no integrity check at all: one flipped scale bit, weights off by 1.4e38."""
    path = quant.save(tmp_path / "q.safetensors", _layers())

    def flip(t):
        t["layers.0.down.scale"].view(torch.int32)[0, 0, 0] ^= 1 << 3  # a mantissa bit: a plausible scale
    _rewrite(path, flip)
    with pytest.raises(ValueError, match="does not match its content hash"):
        quant.load(path)


def test_a_huge_scale_is_refused_even_in_a_file_without_hash(tmp_path):
    """Was: a scale of 1.4e38 was accepted."""
    path = quant.save(tmp_path / "q.safetensors", _layers())

    def huge(t):
        t["layers.0.gate_up.scale"][0, 0, 0] = 1.4e38
    _rewrite(path, huge, keep_hash=False)
    with pytest.warns(_UNVERIFIED), pytest.raises(ValueError, match="at most 2.68e\\+36"):
        quant.load(path)


@pytest.mark.parametrize("scheme", ["int8-channel", "fp8-channel"])
def test_codes_the_quantizer_never_writes_are_refused(tmp_path, scheme):
    path = quant.save(tmp_path / "q.safetensors", _layers(scheme))

    def bad(t):
        t["layers.0.gate_up.q"].view(torch.uint8)[0, 0, 0] = 0x80 if scheme.startswith("int8") else 0x7F
    _rewrite(path, bad, keep_hash=False)
    with pytest.warns(_UNVERIFIED), pytest.raises(ValueError, match="code.s. (-128|NaN)"):
        quant.load(path)


def test_a_file_without_hash_loads_with_a_warning_or_is_refused_under_strict(tmp_path):
    path = quant.save(tmp_path / "q.safetensors", _layers())
    _rewrite(path, lambda t: None, keep_hash=False)
    with pytest.warns(_UNVERIFIED, match="carries no content hash"):
        back = quant.load(path)
    assert torch.equal(back[0].gate_up.q, _layers()[0].gate_up.q)
    with pytest.raises(ValueError, match="strict=True refuses it"):
        quant.load(path, strict=True)


def test_load_of_a_folder_or_a_missing_or_broken_file_names_it(tmp_path):
    """Was: 'No such device' for a folder; the raw safetensors error for a broken file."""
    with pytest.raises(IsADirectoryError, match="is a folder; quant.load reads the one .safetensors file"):
        quant.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no quantized experts file at"):
        quant.load(tmp_path / "nope.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(ValueError, match="junk.safetensors is not a readable safetensors file"):
        quant.load(tmp_path / "junk.safetensors")


def test_a_layer_shared_by_two_indices_is_saved_as_copies(tmp_path):
    """Was: safetensors' 'Some tensors share memory ... use save_model' advice, which does not apply."""
    qe = _layers()[0]
    path = quant.save(tmp_path / "q.safetensors", {0: qe, 1: qe})
    back = quant.load(path)
    assert sorted(back) == [0, 1]
    assert all(torch.equal(back[i].down.scale, qe.down.scale) for i in (0, 1))


def test_bad_layer_indices_are_named():
    qe = _layers()[0]
    with pytest.raises(ValueError, match=r"layer index >= 0.*got -1"):
        quant.save("unused.safetensors", {-1: qe})
