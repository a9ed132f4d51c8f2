"""The experts backend, the lean forward and the decode engine against transformers (CPU, fp32).

Tolerances (fp32): logits within 1e-5 of transformers' largest |logit| (the backend and the lean
forward reorder a few sums); greedy tokens identical.
"""
import io

import pytest
import torch
from transformers import AutoModelForCausalLM

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch.engine import Engine, LeanModel, SamplingParams, bucket, register, sample, set_cpu_path
from dispatch.engine.backend import experts_path
from dispatch.engine.sampling import sample_torch
from dispatch.hf import TINY_FAMILIES, tiny_model

LOGIT_TOL = 1e-5  # × max |logit|
LEAN = ("olmoe", "mixtral", "qwen2_moe", "qwen3_moe")
PROMPTS = ["def main(", "import os\n", "class Foo:", "for i in range(", "    return ", "x = [", "# compute",
           "if __name__"]


def close(a, b, tol=LOGIT_TOL):
    return (a - b).abs().max().item() <= tol * b.abs().max().item()


@pytest.fixture(scope="module")
def trained():
    from dispatch.train import load

    loaded = load("cpu")
    return loaded.model, [loaded.tokenizer(p)["input_ids"] for p in PROMPTS]


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_backend_logits_match_transformers(family):
    register()
    _, model = tiny_model(family)
    ids = torch.randint(0, 128, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(ids).logits
        model.set_experts_implementation("dispatch")
        assert model.config._experts_implementation == "dispatch"
        ours = model(ids).logits
    assert close(ours, ref)


@pytest.mark.parametrize("family", ["olmoe", "deepseek_v3"])
def test_backend_kernels_under_interpreter(family):
    register()
    _, model = tiny_model(family)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = model(ids).logits
        model.set_experts_implementation("dispatch")
        set_cpu_path("kernels")
        try:
            assert experts_path(torch.zeros(5, 64)) == "decode"
            assert experts_path(torch.zeros(65, 64)) == "grouped"
            ours = model(ids).logits
        finally:
            set_cpu_path("reference")
    assert close(ours, ref)


def test_from_pretrained_with_dispatch_experts(tmp_path):
    register()
    _, model = tiny_model("qwen3_moe")
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, experts_implementation="dispatch").eval()
    assert loaded.config._experts_implementation == "dispatch"
    ids = torch.arange(12)[None]
    with torch.no_grad():
        assert close(loaded(ids).logits, model(ids).logits)


def test_backend_bad_input():
    with pytest.raises(ValueError, match="cpu path"):
        set_cpu_path("fast")


@pytest.mark.parametrize("family", LEAN)
def test_lean_forward_matches_transformers(family):
    _, model = tiny_model(family)
    lean = LeanModel.from_hf(model)
    ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    cache = lean.new_cache(2, 16)
    with torch.no_grad():
        ref = model(ids).logits
        pre = lean(ids[:, :8], torch.arange(8).expand(2, 8), cache, prefill=True)
        step = lean(ids[:, 8:], torch.full((2, 1), 8), cache, prefill=False)
    assert close(pre, ref[:, :8]) and close(step[:, 0], ref[:, 8])


def test_engine_refuses_past_the_sliding_window():
    _, model = tiny_model("mixtral", sliding_window=16)
    Engine(model, max_seq=16)
    with pytest.raises(ValueError, match="sliding window"):
        Engine(model, max_seq=17)


def test_lean_rejects_latent_attention():
    _, model = tiny_model("deepseek_v3")
    with pytest.raises(ValueError, match="dispatch' experts backend"):
        LeanModel.from_hf(model)


def test_deepseek_v3_through_the_engine_matches_generate():
    """transformers' own MLA forward over static caches, a ragged batch: greedy identical to generate()."""
    from dispatch.engine.hfmodel import HFModel

    _, model = tiny_model("deepseek_v3")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 9, 3)]
    eng = Engine(model, max_batch=3, max_seq=40)
    assert isinstance(eng.model, HFModel) and model.config._experts_implementation == "dispatch"
    out = eng.generate(prompts, 12)
    again = eng.generate(prompts[1:2], 12)  # a fresh prefill reuses the caches
    model.set_experts_implementation("eager")
    for p, ours in zip(prompts, out.tokens, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert ours == ref[0, len(p):].tolist()
    assert again.tokens[0] == out.tokens[1]


def greedy_matches(model, ids, new):
    """A ragged batch through the engine, token for token vs generate() one prompt at a time."""
    out = Engine(model, max_batch=len(ids), max_seq=128).generate(ids, new, stop_tokens=(0,))
    for p, toks in zip(ids, out.tokens, strict=True):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False)[0, len(p):]
        assert toks == ref.tolist()


def test_greedy_matches_transformers_generate_fast(trained):
    model, ids = trained
    greedy_matches(model, ids[::3], 16)


@pytest.mark.slow
def test_greedy_matches_transformers_generate(trained):
    """8 prompts × 64 tokens."""
    model, ids = trained
    greedy_matches(model, ids, 64)


def test_stream_stop_and_buckets(trained):
    model, ids = trained
    eng = Engine(model, max_batch=3, max_seq=64)
    first = eng.generate(ids[:3], 8)
    assert [len(t) for t in first.tokens] == [8, 8, 8] and eng.max_batch == bucket(3) == 4
    seen = []
    stopped = eng.generate(ids[:3], 8, stop_tokens=(first.tokens[1][2],), on_token=seen.append)
    assert stopped.tokens[1] == first.tokens[1][:3]  # stops after (and keeps) the stop token
    assert stopped.tokens[0] == first.tokens[0][:len(stopped.tokens[0])]
    assert [s[1] for s in seen[3:]] == [None] * (len(seen) - 3)
    alone = Engine(model, max_batch=1, max_seq=64).generate([ids[2]], 8)
    assert alone.tokens[0] == first.tokens[2]  # a row does not depend on its batch


def test_engine_bad_input(trained):
    model, ids = trained
    eng = Engine(model, max_batch=2, max_seq=16)
    for bad, match in (([], "prompts"), ([[1]] * 3, "prompts"), ([[]], "at least one"), ([[1] * 10], "max_seq")):
        with pytest.raises(ValueError, match=match):
            eng.generate(bad, 8)
    with pytest.raises(ValueError, match="batch"):
        bucket(257)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(temperature=1.0, top_p=0.0)


def test_sampling_law_and_seed():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    params = SamplingParams(temperature=0.7, top_p=0.9)
    t, p = torch.tensor(params.temperature), torch.tensor(params.top_p)
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([sample(logits, t, p, generator=gen) for _ in range(4000)])[:, 0]
    gen = torch.Generator().manual_seed(0)
    twin = torch.stack([sample_torch(logits, params, gen) for _ in range(4000)])[:, 0]
    probs = torch.softmax(logits[0] / 0.7, -1)
    keep = (probs.cumsum(0) - probs) < 0.9
    want = torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()
    for d in (draws, twin):
        freq = torch.bincount(d, minlength=5).float() / len(d)
        assert (freq - want).abs().max() < 0.03  # ~4 standard errors at 4000 draws
    assert sample(logits, t, torch.tensor(1e-6)).item() == 0  # top_p → 0 keeps only the best
    assert sample(logits).item() == 0


def test_seeded_sampling_repeats(trained):
    model, ids = trained
    eng = Engine(model, max_batch=2, max_seq=64)
    params = SamplingParams(temperature=1.0, top_p=0.95, seed=7)
    a, b = eng.generate(ids[:2], 16, params), eng.generate(ids[:2], 16, params)
    assert a.tokens == b.tokens
    assert eng.generate(ids[:2], 16, SamplingParams(1.0, 0.95, seed=8)).tokens != a.tokens


def test_cli_generates_python_looking_text():
    from dispatch.generate import main

    buf = io.StringIO()
    rep = main(["--model", "cpu", "--prompt", "class Foo:\n    def ", "--max-new-tokens", "24"], out=buf)
    text = buf.getvalue()
    assert "decode" in text and "tok/s" in text and rep["new_tokens"][0] >= 1
    assert any(s in rep["texts"][0] for s in ("(", ":", "self", "=", "_"))


def test_step_bytes_olmoe_by_hand():
    """OLMoE-1B-7B at batch 1, bf16: attention 0.54 GB, 8 experts × 16 layers 1.61 GB, lm_head 0.21 GB."""
    from dispatch.hf import hub_config
    from dispatch_book.bench.e2e import step_bytes

    cfg = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded")
    b = step_bytes(cfg, 1, 0, 2)
    H, L = 2048, 16
    assert b["attention"] == L * (4 * H * H + 4 * H) * 2  # q, k, v, o + q/k norms + 2 layer norms
    assert b["experts_and_router"] == L * (8 * 3 * H * 1024 + 64 * H) * 2
    assert b["lm_head"] == 50304 * H * 2 and b["kv_cache"] == 0
    assert step_bytes(cfg, 4096, 0, 2)["experts_used_per_layer"] == pytest.approx(64)


def test_profile_kinds():
    from dispatch.engine.profile import kind_of

    assert kind_of("_up_swiglu_kernel") == "experts" and kind_of("_route_kernel") == "router"
    assert kind_of("_fused_decode_kernel") == "experts"
    assert kind_of("_router_logits_kernel") == kind_of("_rank_kernel") == kind_of("_router_topk_kernel") == "router"
    assert kind_of("fmha_cutlassF_bf16_aligned_64x128") == "attention"
    assert kind_of("nvjet_tst_64x8_64x16_2x1_v_bz_TNT") == "projections (GEMV/GEMM)"
    assert kind_of("_add_rms_kernel") == "norms, rope, elementwise"
