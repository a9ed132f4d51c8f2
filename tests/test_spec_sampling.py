"""Speculative sampling (temperature > 0): what it emits is distributed as the target's own samples.

Two levels, seeded (deterministic verdicts):
* the acceptance rule alone: hand-made target logits and draft distributions, 200 000 rows at once;
  the first emitted token must follow p_0 and, after an accepted first draft, the second p_1
  (total-variation distance below 0.01, where sampling noise is ~0.002); a typical wrong rule
  (drawing a rejected position from p instead of the residual max(0, p − q)) must fail the same test;
* the whole engine: a tiny model with an 8-token vocabulary, prompt lookup and a draft model, the
  joint law of the first three tokens (chi-square over 64-cell pair marginals, against the exact
  probabilities enumerated from the model; threshold: mean + 6 standard deviations of chi-square).
"""
import math

import pytest
import torch

from dispatch.engine import LeanModel, SamplingParams
from dispatch.engine.sampling import draw, sampling_probs
from dispatch.hf import tiny_model
from dispatch.serve.acceptance import speculative_sample
from dispatch.serve.drafters import DraftModel, PromptLookup
from dispatch.serve.speculative import SpeculativeEngine

N = 200_000


def tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * (counts.double() / counts.sum() - p.double()).abs().sum().item()


def case(k: int, V: int = 6, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(k + 1, V, generator=g) * 1.5).expand(N, k + 1, V)
    q = torch.softmax(torch.randn(k, V, generator=g) * 1.5, -1).expand(N, k, V).contiguous()
    drafts = draw(q.reshape(N * k, V), g).view(N, k)  # drafts drawn from q, as a draft model does
    return logits, q, drafts, g


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.8)])
@pytest.mark.parametrize("k", [1, 3])
def test_emitted_tokens_follow_the_target(k, temperature, top_p):
    logits, q, drafts, g = case(k)
    p = sampling_probs(logits[0], temperature, top_p)  # [k+1, V]
    out, n = speculative_sample(drafts, q, logits, temperature, top_p, generator=g)
    assert out.shape == (N, k + 1) and n.min() >= 0 and n.max() <= k
    assert tv(torch.bincount(out[:, 0], minlength=6), p[0]) < 0.01
    second = out[n >= 1, 1]  # the first draft was kept, so the second token followed it
    assert tv(torch.bincount(second, minlength=6), p[1]) < 0.01
    if top_p < 1:
        assert (p[0][out[:, 0]] > 0).all(), "a token outside the top-p set was emitted"
    # accepted as often as the theory says: P(keep d_1) = Σ_x min(p(x), q(x))
    assert abs((n >= 1).double().mean().item() - torch.minimum(p[0], q[0, 0]).sum().item()) < 0.01


def test_deterministic_drafter_follows_the_target():
    """Prompt lookup's drafts are no sample: q is a point mass on the draft (q_BKV = None)."""
    logits, _, _, g = case(2, seed=1)
    drafts = torch.tensor([[3, 1]]).expand(N, 2)
    p = sampling_probs(logits[0], 1.0, 1.0)
    out, n = speculative_sample(drafts, None, logits, 1.0, generator=g)
    assert tv(torch.bincount(out[:, 0], minlength=6), p[0]) < 0.01
    assert abs((n >= 1).double().mean().item() - p[0, 3].item()) < 0.01  # kept with probability p(d)


def test_a_wrong_rule_fails_the_same_test():
    """Resampling a rejected position from p (forgetting to subtract q) is biased towards the draft:
    the check above catches it."""
    logits, q, drafts, g = case(1, seed=2)
    p = sampling_probs(logits[0], 1.0, 1.0)
    p_d = p[0][drafts[:, 0]]
    keep = torch.rand(N, generator=g) * q[0, 0][drafts[:, 0]] < p_d
    wrong = torch.where(keep, drafts[:, 0], draw(p[0].expand(N, 6), g))
    assert tv(torch.bincount(wrong, minlength=6), p[0]) > 0.03


def test_rejects_bad_shapes():
    with pytest.raises(ValueError, match="q must be"):
        speculative_sample(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 2, 5), torch.zeros(2, 4, 5), 1.0)


def _exact_joint(lean, prompt: list[int], params: SamplingParams, V: int) -> torch.Tensor:
    """P(t1, t2, t3) [V, V, V] by enumeration: the target's sampling distribution after each prefix."""
    def probs(prefix):
        ids = torch.tensor([prefix])
        with torch.no_grad():
            logits = lean(ids, torch.arange(len(prefix))[None], lean.new_cache(1, 16), prefill=True)[0, -1]
        return sampling_probs(logits[None], params.temperature, params.top_p)[0].double()

    joint = torch.zeros(V, V, V, dtype=torch.float64)
    p1 = probs(prompt)
    for a in range(V):
        p2 = probs(prompt + [a])
        for b in range(V):
            joint[a, b] = p1[a] * p2[b] * probs(prompt + [a, b])
    return joint


def chi2_ok(counts: torch.Tensor, p: torch.Tensor) -> bool:
    n = counts.sum().item()
    exp = p * n
    keep = exp >= 5  # pool the rare cells
    obs = torch.cat([counts[keep].double(), counts[~keep].sum()[None].double()])
    exp = torch.cat([exp[keep], exp[~keep].sum()[None]])
    stat = ((obs - exp) ** 2 / exp.clamp(min=1e-12)).sum().item()
    df = len(obs) - 1
    return stat < df + 6 * math.sqrt(2 * df)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["lookup", "draft"])
def test_engine_samples_follow_the_target(drafter):
    V = 8
    target = tiny_model("olmoe", vocab_size=V)[1]
    with torch.no_grad():
        target.lm_head.weight *= 12  # peaked distributions (a random model's are nearly uniform)
    lean = LeanModel.from_hf(target)
    d = PromptLookup(n_max=2) if drafter == "lookup" else DraftModel(tiny_model("olmoe", vocab_size=V, seed=4)[1])
    spec = SpeculativeEngine(lean, d, k=2, max_batch=256, max_seq=16)
    prompt = [1, 2, 3, 1, 2, 3, 1]
    params = SamplingParams(temperature=0.9, top_p=0.95)
    rows, kept = [], 0
    for seed in range(50):
        out = spec.generate([prompt] * 256, 3, SamplingParams(params.temperature, params.top_p, seed))
        rows += out.tokens
        kept += sum(map(sum, out.extra["accepted"]))
    samples = torch.tensor(rows)
    assert samples.shape == (12800, 3) and kept > 300  # drafts were kept, often
    joint = _exact_joint(lean, prompt, params, V)
    for dims, (i, j) in (((2,), (0, 1)), ((0,), (1, 2)), ((1,), (0, 2))):
        counts = torch.bincount(samples[:, i] * V + samples[:, j], minlength=V * V)
        assert chi2_ok(counts, joint.sum(dims).flatten()), f"tokens {i} and {j}"
    # the test has power: the same samples against the target at another temperature fail
    hotter = _exact_joint(lean, prompt, SamplingParams(temperature=1.5), V)
    assert not chi2_ok(torch.bincount(samples[:, 1] * V + samples[:, 2], minlength=V * V), hotter.sum(0).flatten())
