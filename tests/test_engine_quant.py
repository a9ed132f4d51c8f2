"""Quantized experts in the backend, the lean forward, the engine and the command (CPU, fp32).

References: the dequantized model (``dispatch.quant.dequantized_model``: transformers' own modules on
codes × scales) — logits within 1e-5 of its largest |logit| (fp32 reorderings), greedy tokens
identical; and the unquantized model — teacher-forced greedy agreement >= 95% (chapter 7's gate).
"""
import io

import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch.engine import Engine, LeanModel, register
from dispatch.engine.quant import quantize, scheme_name
from dispatch.hf import tiny_model
from dispatch.quant import dequantized_model, quantize_model, swap_experts

TOL = 1e-5
AGREEMENT = 0.95  # chapter 7: teacher-forced greedy agreement of int8 with the unquantized model
PROMPTS = ["def main(", "import os\n", "class Foo:", "for i in range(", "    return ", "x = [", "# compute",
           "if __name__"]


def close(a, b):
    return (a - b).abs().max().item() <= TOL * b.abs().max().item()


def quantized_pair(family, scheme="int8-channel"):
    """(transformers model with our quantized experts swapped in, its dequantized twin)."""
    _, model = tiny_model(family)
    layers = quantize_model(model, scheme)
    deq = dequantized_model(model, layers)
    return swap_experts(model, layers), deq


@pytest.mark.parametrize("family", ["olmoe", "qwen2_moe", "deepseek_v3"])
def test_backend_on_quantized_model_matches_dequantized(family):
    register()
    model, deq = quantized_pair(family)
    model.set_experts_implementation("dispatch")
    assert model.config._experts_implementation == "dispatch"
    for T in (5, 70):  # the quantized decode kernels, then the grouped GEMM (interpreter)
        ids = torch.randint(0, 128, (1, T), generator=torch.Generator().manual_seed(T))
        with torch.no_grad():
            assert close(model(ids).logits, deq(ids).logits)


@pytest.mark.parametrize("family,scheme", [("olmoe", "int8-channel"), ("qwen3_moe", "int8-group128"),
                                           ("qwen2_moe", "fp8-block128")])
def test_lean_forward_quantized_matches_dequantized(family, scheme):
    model, deq = quantized_pair(family, scheme)
    paths = ["torch", "decode"] if scheme.startswith("int8") else ["torch"]  # no e4m3 in the interpreter
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        ref = deq(ids).logits
        for path in paths:
            lean = LeanModel.from_hf(model, moe_path=path)
            assert "quant" in lean.layers[-1]
            cache = lean.new_cache(2, 8)
            pre = lean(ids[:, :6], torch.arange(6).expand(2, 6), cache, prefill=True)
            step = lean(ids[:, 6:], torch.full((2, 1), 6), cache, prefill=False)
            assert close(pre, ref[:, :6]) and close(step[:, 0], ref[:, 6]), path


@pytest.fixture(scope="module")
def trained():
    from dispatch.train import load

    loaded = load("cpu")
    return loaded.model, [loaded.tokenizer(p)["input_ids"] for p in PROMPTS]


def test_engine_int8_greedy(trained):
    """Greedy through the int8 engine: identical to generate() on the dequantized model; teacher-forced
    agreement with the unquantized engine's tokens at chapter 7's level."""
    model, ids = trained
    layers = quantize_model(model, "int8-channel")
    deq = dequantized_model(model, layers)
    new = 32
    plain = Engine(model, max_batch=8, max_seq=128).generate(ids, new, stop_tokens=(0,)).tokens
    qmodel = swap_experts(dequantized_model(model, layers), layers)
    lean = LeanModel.from_hf(qmodel)
    quant = Engine(lean, max_batch=8, max_seq=128).generate(ids, new, stop_tokens=(0,)).tokens
    hits = total = 0
    for p, ours, ref in zip(ids, quant, plain, strict=True):
        with torch.no_grad():
            want = deq.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p):].tolist()
            assert ours == want[:len(ours)] and (len(ours) == new or ours[-1] == 0)
            seq = torch.tensor([p + ref])
            logits = lean(seq, torch.arange(seq.shape[1])[None], lean.new_cache(1, seq.shape[1]), prefill=True)
        pred = logits[0, len(p) - 1:-1].argmax(-1).tolist()
        hits += sum(a == b for a, b in zip(pred, ref, strict=True))
        total += len(ref)
    assert hits / total >= AGREEMENT, hits / total


def test_engine_int8_kernels_match_reference_path(trained):
    """The interpreter's int8 decode kernels and the dequantized reference pick the same tokens."""
    model, ids = trained
    qmodel = quantize(dequantized_model(model, quantize_model(model, "int8-channel")), "int8")
    a = Engine(LeanModel.from_hf(qmodel, moe_path="decode"), max_seq=64).generate(ids[:1], 6).tokens
    b = Engine(LeanModel.from_hf(qmodel), max_seq=64).generate(ids[:1], 6).tokens
    assert a == b


def test_cli_quant_and_bad_names():
    from dispatch.generate import main

    buf = io.StringIO()
    rep = main(["--model", "cpu", "--prompt", "def ", "--max-new-tokens", "8", "--quant", "int8"], out=buf)
    assert rep["quant"] == "int8-channel" and "experts int8-channel" in buf.getvalue()
    assert scheme_name("fp8") == "fp8-channel" and scheme_name("fp8-block128") == "fp8-block128"
    with pytest.raises(ValueError, match="quantization must be one of"):
        scheme_name("int4")


def test_lean_from_hf_with_quantized_layers_leaves_the_model():
    _, model = tiny_model("mixtral")
    layers = quantize_model(model, "int8-channel")
    deq = dequantized_model(model, layers)
    lean = LeanModel.from_hf(model, quantized=layers)
    assert hasattr(model.model.layers[0].mlp.experts, "gate_up_proj")  # untouched
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = lean(ids, torch.arange(6)[None], lean.new_cache(1, 6), prefill=True)
        assert close(got, deq(ids).logits)
    with pytest.raises(ValueError, match="not MoE layers"):
        LeanModel.from_hf(model, quantized={**layers, 7: layers[0]})
