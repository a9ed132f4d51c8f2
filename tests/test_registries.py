"""The tables the library grows by: routing families (dispatch.families) and quantization schemes
(dispatch.schemes). Every part that depends on a family or a scheme reads its entry, and an unknown
name fails loudly wherever it enters (config, reference, kernel launcher, transformers mapping, tile
resolver, quantizer, engine, tuner) instead of falling into another entry's code."""
import pytest
import torch

from dispatch import families, schemes
from dispatch.config import MoEConfig
from dispatch.kernels import routing, tiles
from dispatch.reference import route_reference, router_logits


def test_every_family_entry_is_complete_and_distinct():
    modes = [f.mode for f in families.FAMILIES.values()]
    assert len(set(modes)) == len(modes) and sorted(modes) == list(range(len(modes)))  # the kernel's MODE
    for name, f in families.FAMILIES.items():
        assert f.name == name and callable(f.reference) and set(f.fast_paths) <= set(families.FAST_PATHS)
        for model_type, mapping in f.hf.items():
            assert families.for_model_type(model_type) == (f, mapping) and mapping.block.endswith(("Block", "MoE"))
    assert routing.SIGMOID == families.get("sigmoid").mode  # the kernel's branches read the table's numbers
    with pytest.raises(ValueError, match="unknown fast paths"):
        families.RoutingFamily("x", 9, families.softmax_reference, fast_paths=frozenset({"warp_drive"}))


@pytest.mark.parametrize("bad", ["relu", "Softmax", "", None])
def test_an_unknown_scoring_fails_loudly(bad):
    with pytest.raises(ValueError, match="scoring must be one of"):
        MoEConfig(16, 8, 4, 2, scoring=bad)
    with pytest.raises(ValueError, match="scoring must be one of"):
        families.get(bad)


def test_a_config_the_family_would_not_read_is_refused():
    with pytest.raises(ValueError, match="correction_bias"):
        MoEConfig(16, 8, 4, 2, correction_bias=True)  # softmax has no selection bias
    with pytest.raises(ValueError, match="n_group"):
        MoEConfig(16, 8, 4, 2, n_group=2)  # softmax ignores groups: refused, not silently dropped
    MoEConfig(16, 8, 4, 2, scoring="sigmoid", n_group=2, correction_bias=True)


def test_reference_and_kernel_take_the_familys_entry(monkeypatch):
    """route_reference calls the entry's function, router_logits its fp32 flag, route its mode."""
    cfg = MoEConfig(16, 8, 4, 2)
    seen = []
    entry = families.FAMILIES["softmax"]

    def spy(logits_TE, c, bias_E=None):
        seen.append(c.scoring)
        return entry.reference(logits_TE, c, bias_E)

    monkeypatch.setitem(families.FAMILIES, "softmax", families.RoutingFamily(
        "softmax", entry.mode, spy, fp32_logits=True, fast_paths=entry.fast_paths, hf=entry.hf))
    route_reference(torch.randn(3, 4), cfg)
    assert seen == ["softmax"]
    from dispatch.config import random_weights

    w = random_weights(cfg)
    assert router_logits(torch.randn(2, 16, dtype=torch.float16), cfg, w.to(dtype=torch.float16)).dtype == torch.float32


def test_transformers_mapping_is_the_tables():
    from dispatch import hf

    assert set(hf.SUPPORTED) == set(families.model_types()) and {"olmoe", "deepseek_v3"} <= set(hf.SUPPORTED)

    class Config:
        model_type = "llama"
    with pytest.raises(ValueError, match="model_type must be one of"):
        hf.config_from_hf(Config())


# ---- quantization schemes ----

def test_every_scheme_entry_is_complete():
    for name, s in schemes.SCHEMES.items():
        assert s.name == name and s.dtype in schemes.CODE_DTYPES and 0 < s.gate < 1
        assert s.table_labels()[0] == name and (len(s.table_labels()) == 2) == s.w8a8
        assert s.w8a8 == (s.dtype == schemes.FP8) and (s.min_capability is not None) == (s.dtype == schemes.FP8)
        for cols in (64, 128, 2048):
            c = s.constexprs(cols)
            assert c["QUANT"] and c["SBR"] == s.block_rows and c["LATE_SCALE"] == s.per_row(cols)
    assert schemes.parse("fp8-channel+w8a8") == (schemes.get("fp8-channel"), True)
    assert schemes.full_name("int8") == "int8-channel" and schemes.full_name("fp8-block128") == "fp8-block128"


def test_the_kernels_constexprs_are_the_schemes():
    from dispatch.kernels.quant_kernels import weight_operand
    from dispatch.quant import quantize_tensor

    for name, s in schemes.SCHEMES.items():
        t = quantize_tensor(torch.randn(2, 256, 384), name)
        assert weight_operand(t)[3] == s.constexprs(384)


@pytest.mark.parametrize("bad", ["int4-channel", "int8-channel+w8a8", "fp8", ""])
def test_an_unknown_scheme_fails_loudly_everywhere(bad):
    from dispatch.engine.quant import scheme_name
    from dispatch.quant import quantize_tensor
    from dispatch.tune import main

    with pytest.raises(ValueError):
        schemes.parse(bad)
    with pytest.raises(ValueError):
        tiles.resolve("decode", (1, 2, 8, 64, 32), torch.float32, "cpu", scheme=bad)
    with pytest.raises(SystemExit, match="--quant"):
        main(["--preset", "tiny", "--quant", str(bad) or "x"])
    with pytest.raises(ValueError):
        quantize_tensor(torch.randn(1, 4, 4), bad)
    if bad != "fp8":  # an alias of the command lines (fp8-channel) for the engine's --quant, nowhere else
        with pytest.raises(ValueError, match="quantization must be one of"):
            scheme_name(bad)
