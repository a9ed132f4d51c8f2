"""dispatch.quant: formats (hand-checked bounds), the container's validation, files, models, gates."""
import pytest
import torch

from dispatch import quant
from dispatch.config import PRESETS, random_weights
from dispatch.quant.formats import FP8, FP8_MAX, QuantizedExperts, QuantizedTensor, fp8_activations

SCHEMES = sorted(quant.SCHEMES)


def _w(E=2, R=40, C=300, seed=0):
    return torch.randn(E, R, C, generator=torch.Generator().manual_seed(seed))


def _block_amax(w, br, bc):
    """max |w| of every br × bc block (zero padding at the edges), computed independently."""
    E, R, C = w.shape
    Rb, Cb = -(-R // br), -(-C // bc)
    out = torch.zeros(E, Rb, Cb)
    for i in range(Rb):
        for j in range(Cb):
            out[:, i, j] = w[:, i * br:(i + 1) * br, j * bc:(j + 1) * bc].abs().flatten(1).amax(1)
    return out


def test_int8_channel_hand_checked():
    qt = quant.quantize_tensor(torch.tensor([[[1.0, -2.0, 0.5]]]), "int8-channel")
    assert qt.scale.item() == pytest.approx(2 / 127)
    assert qt.q.tolist() == [[[64, -127, 32]]]  # 63.5 rounds half to even → 64; 31.75 → 32


@pytest.mark.parametrize("scheme", ["int8-channel", "int8-group128"])
def test_int8_error_at_most_half_a_step(scheme):
    w = _w()
    qt = quant.quantize_tensor(w, scheme)
    bc = 128 if scheme.endswith("128") else w.shape[2]
    assert tuple(qt.scale.shape) == (2, 40, -(-300 // bc))
    step = qt.scale.repeat_interleave(bc, dim=2)[:, :, :300]
    assert torch.all((qt.dequantize() - w).abs() <= step / 2 * (1 + 1e-6))
    assert int(qt.q.abs().max()) == 127 and int(qt.q.min()) >= -127
    torch.testing.assert_close(qt.scale, _block_amax(w, 1, bc) / 127)  # each block's amax → code ±127


@pytest.mark.parametrize("scheme", ["fp8-channel", "fp8-block128"])
def test_fp8_amax_maps_to_448_and_relative_error(scheme):
    w = _w(R=200)
    qt = quant.quantize_tensor(w, scheme)
    br, bc = (128, 128) if scheme.endswith("128") else (1, 300)
    assert tuple(qt.scale.shape) == (2, -(-200 // br), -(-300 // bc))
    torch.testing.assert_close(qt.scale, _block_amax(w, br, bc) / FP8_MAX)
    assert qt.q.float().abs().max().item() == FP8_MAX
    s = quant.formats.expand_scale(qt.scale, qt.block, 200, 300)
    bound = torch.maximum(w.abs() * 2.0 ** -4, s * 2.0 ** -10) * (1 + 1e-5)  # half a step (normal / subnormal)
    assert torch.all((qt.dequantize() - w).abs() <= bound)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_zero_and_tiny_blocks_get_a_finite_positive_scale(scheme):
    w = _w(R=130, C=260)
    w[0, :] = 0.0  # an all-zero expert: every row and block
    w[1, 5] = 0.0  # one all-zero row
    w[1, 7] = 1e-44  # denormal magnitudes
    qt = quant.quantize_tensor(w, scheme)
    assert torch.isfinite(qt.scale).all() and (qt.scale > 0).all()
    d = qt.dequantize()
    assert torch.isfinite(d).all() and d[0].abs().max() == 0 and d[1, 5].abs().max() == 0
    if not scheme.endswith("block128"):
        assert torch.all(qt.scale[0] == 1.0)


def test_quantize_rejects_bad_input():
    with pytest.raises(ValueError, match="inf or NaN"):
        quant.quantize_tensor(torch.tensor([[[1.0, float("nan")]]]), "int8-channel")
    with pytest.raises(ValueError, match=r"\[E, R, C\]"):
        quant.quantize_tensor(torch.ones(3, 4), "int8-channel")
    with pytest.raises(ValueError, match="scheme must be one of"):
        quant.quantize_tensor(_w(), "int4")


def test_container_validation():
    good = quant.quantize_tensor(_w(), "int8-channel")
    with pytest.raises(ValueError, match="scale must be float32 of shape"):
        QuantizedTensor(good.q, good.scale[:, :3], 1, 300)
    with pytest.raises(ValueError, match="scale must be float32"):
        QuantizedTensor(good.q, good.scale.double(), 1, 300)
    for bad in (0.0, float("nan"), float("inf")):
        s = good.scale.clone()
        s[0, 0, 0] = bad
        with pytest.raises(ValueError, match="finite and > 0"):
            QuantizedTensor(good.q, s, 1, 300)
    with pytest.raises(ValueError, match="int8 or float8_e4m3fn"):
        QuantizedTensor(good.q.int(), good.scale, 1, 300)
    with pytest.raises(ValueError, match="block_rows must be a positive int"):
        QuantizedTensor(good.q, good.scale, 0, 300)
    gu = quant.quantize_tensor(_w(R=64, C=48), "fp8-channel")
    dn = quant.quantize_tensor(_w(R=48, C=32), "fp8-channel")
    QuantizedExperts("fp8-channel", gu, dn)
    with pytest.raises(ValueError, match="scheme int8-channel stores"):
        QuantizedExperts("int8-channel", gu, dn)
    with pytest.raises(ValueError, match=r"gate_up must be \[E, 2I, H\]"):
        QuantizedExperts("fp8-channel", gu, quant.quantize_tensor(_w(R=48, C=16), "fp8-channel"))
    with pytest.raises(ValueError, match="must be a QuantizedTensor"):
        QuantizedExperts("fp8-channel", gu, dn.q)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_nbytes_exact_and_half_of_bf16(scheme):
    cfg = PRESETS["tiny"].replace(hidden_size=256, intermediate_size=128)
    w = random_weights(cfg)
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)
    E, H, I = cfg.E, cfg.H, cfg.I
    assert (qe.E, qe.H, qe.I) == (E, H, I)
    assert qe.nbytes() == 3 * E * H * I + 4 * (qe.gate_up.scale.numel() + qe.down.scale.numel())
    assert qe.nbytes() <= 0.52 * 3 * E * H * I * 2
    assert quant.get_scheme(scheme).expert_bytes(E, H, I) == qe.nbytes()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_save_load_identity(tmp_path, scheme):
    layers = {}
    for layer in (0, 3):
        w = random_weights(PRESETS["tiny"], seed=layer)
        layers[layer] = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)
    path = quant.save(tmp_path / "q.safetensors", layers)
    back = quant.load(path)
    assert sorted(back) == [0, 3]
    for i, qe in layers.items():
        assert back[i].scheme == scheme
        for part in ("gate_up", "down"):
            a, b = getattr(qe, part), getattr(back[i], part)
            assert a.q.dtype == b.q.dtype and torch.equal(a.q.view(torch.int8), b.q.view(torch.int8))
            assert torch.equal(a.scale, b.scale) and a.block == b.block
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "dispatch.quant/1" and meta["scheme"] == scheme and meta["scale_dtype"] == "torch.float32"


def test_load_rejects_other_files_and_mixed_schemes(tmp_path):
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a dispatch.quant/1 file"):
        quant.load(tmp_path / "other.safetensors")
    w = random_weights(PRESETS["tiny"])
    a = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "int8-channel")
    b = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "fp8-channel")
    with pytest.raises(ValueError, match="one file holds one scheme"):
        quant.save(tmp_path / "m.safetensors", {0: a, 1: b})


def test_quantize_model_and_dequantized_copy():
    from dispatch.hf import moe_blocks, tiny_model

    _, model = tiny_model("qwen3_moe")
    layers = quant.quantize_model(model, "int8-group128")
    blocks = dict(moe_blocks(model))
    assert sorted(layers) == sorted(blocks)
    before = {i: b.experts.gate_up_proj.detach().clone() for i, b in blocks.items()}
    copy = quant.dequantized_model(model, layers)
    for i, b in moe_blocks(copy):
        gu, _ = layers[i].dequantize()
        assert torch.equal(b.experts.gate_up_proj.detach(), gu)
        assert torch.equal(blocks[i].experts.gate_up_proj.detach(), before[i])  # the original is untouched
    with pytest.raises(ValueError, match="do not match"):
        quant.dequantized_model(model, {99: layers[next(iter(layers))]})


def test_fp8_activations_hand_checked():
    a = torch.tensor([[1.0, -2.0, 127.4 / 448 * 2]])  # group of 3: amax 2 → 448
    r = fp8_activations(a, group=128)
    s = 2.0 / FP8_MAX
    torch.testing.assert_close(r, (a / s).to(FP8).float() * s)
    assert r[0, 1].item() == -2.0


def test_layer_error_gate_on_tiny():
    from dispatch import schemes

    for scheme, s in schemes.SCHEMES.items():  # each scheme's own accuracy gate
        r = quant.layer_error(PRESETS["tiny"], scheme, experts=8, tokens=32)
        assert 0 < r["output_rel_err"] < s.gate and r["bytes_ratio"] < 0.55


def test_greedy_agreement_of_a_model_with_itself():
    from dispatch.hf import tiny_model

    _, model = tiny_model("olmoe")
    prompts = torch.randint(0, 128, (2, 4), generator=torch.Generator().manual_seed(0))
    r = quant.greedy_agreement(model, model, prompts, new_tokens=4)
    assert r["teacher_forced"] == 1.0 and r["free_running"] == 1.0 and r["identical"] == 2
