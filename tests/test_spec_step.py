"""The speculative step's two kernels (dispatch.kernels.spec_step) against their torch twins, under
Triton's interpreter on CPU: prompt lookup over random small-vocabulary histories, greedy acceptance +
rollback at its edges, the launchers' checks, and the engine giving the same tokens either way."""
import pytest
import torch

from dispatch import runtime
from dispatch.hf import tiny_model
from dispatch.kernels.spec_step import accept_advance, accept_advance_torch, lookup_drafts
from dispatch.serve.drafters import PromptLookup, lookup
from dispatch.serve.speculative import SpeculativeEngine


@pytest.mark.parametrize("seed", range(4))
def test_lookup_drafts_is_lookup(seed):
    g = torch.Generator().manual_seed(seed)
    V = 3 + seed % 3
    for S in (1, 9, 40, 600):  # 600: more than one tile of ends
        B = 6
        hist = torch.randint(0, V, (B, S), generator=g)
        last = torch.randint(0, S, (B,), generator=g)
        last[0], last[-1] = 0, S - 1  # the first position; the whole history
        for n_max, n_min in ((3, 1), (2, 2), (4, 2), (1, 1)):
            for k in (0, 1, 4, 16):
                want = lookup(hist, last, k, n_max, n_min)
                assert torch.equal(lookup_drafts(hist, last, k, n_max, n_min), want), (S, n_max, n_min, k)
                assert torch.equal(lookup_drafts(hist, last.int(), k, n_max, n_min), want)


def test_lookup_drafts_edges():
    # no match: every token distinct, the last one k times
    hist = torch.arange(20).view(2, 10)
    assert lookup_drafts(hist, torch.tensor([9, 4]), 3).tolist() == [[9, 9, 9], [14, 14, 14]]
    # a match ending at position 0, then periodic continuation (period last - end = 3)
    hist = torch.tensor([[7, 1, 2, 7, 0, 0], [5, 5, 5, 5, 5, 5]])
    got = lookup_drafts(hist, torch.tensor([3, 0]), 7, 3, 1)
    assert got.tolist() == [[1, 2, 7, 1, 2, 7, 1], [5] * 7]  # row 1: last 0, nothing before it
    assert torch.equal(got, lookup(hist, torch.tensor([3, 0]), 7, 3, 1))
    # worked example of drafters.lookup; a strided view of a wider history
    wide = torch.tensor([[1, 2, 3, 1, 2, 0, 0, 0]]).repeat_interleave(2, dim=1)[:, ::2]
    assert lookup_drafts(wide, torch.tensor([4]), 5, 2, 1).tolist() == [[3, 1, 2, 3, 1]]


def _accept_case(g, B, k, S, agree):
    drafts = torch.randint(0, 4, (B, k), generator=g)
    picks = torch.randint(0, 4, (B, k + 1), generator=g)
    for b in range(B):  # row b agrees with its first agree[b] drafts, then differs
        a = min(agree[b], k)
        picks[b, :a] = drafts[b, :a]
        if a < k:
            picks[b, a] = (drafts[b, a] + 1) % 4
    pos = torch.randint(0, S // 2, (B,), generator=g)
    hist = torch.randint(0, 4, (B, S), generator=g)
    return hist, pos, drafts, picks


@pytest.mark.parametrize("k", [0, 1, 4, 16])
def test_accept_advance_is_greedy_accept_then_advance(k):
    g = torch.Generator().manual_seed(k)
    B, S = 7, 64
    hist, pos, drafts, picks = _accept_case(g, B, k, S, agree=[0, k, 1, k // 2, k, 2, 3])
    # caps: far, reached (adv 0), behind pos (adv 0), one token left, two left, far, far
    cap = pos + torch.tensor([40, 0, -3, 1, 2, 40, 40])
    h1, p1, t1 = hist.clone(), pos.clone(), torch.zeros(B, dtype=torch.long)
    h2, p2, t2 = hist.clone(), pos.clone(), torch.zeros(B, dtype=torch.long)
    adv = accept_advance(h1, p1, drafts, picks, cap, t1)
    want = accept_advance_torch(h2, p2, drafts, picks, cap, t2)
    assert torch.equal(adv, want) and torch.equal(h1, h2) and torch.equal(p1, p2) and torch.equal(t1, t2)
    assert adv[1] == 0 and adv[2] == 0 and adv[3] == 1  # cap reached, behind, one left
    assert adv[4] == min(k + 1, 2) and adv[0] == 1  # all accepted (clipped by the cap); none accepted
    assert adv[5] == min(2, k) + 1
    assert torch.equal(t1, h1.gather(1, p1[:, None])[:, 0])


@pytest.mark.parametrize("k", [0, 3, 8])
def test_accept_advance_writes_the_hosts_row_in_the_same_launch(k):
    """With ``res_BK2``: [adv, picks_0 .. picks_k] per row in a wider buffer, adv returned as its column 0,
    the rest of the buffer untouched; the twin does the same."""
    g = torch.Generator().manual_seed(k + 3)
    B, S = 5, 48
    hist, pos, drafts, picks = _accept_case(g, B, k, S, agree=[0, k, k // 2, 1 % (k + 1), k])
    cap = pos + torch.tensor([40, 0, 40, 2, 40])
    got, want = [], []
    for fn, out in ((accept_advance, got), (accept_advance_torch, want)):
        h, p, tok = hist.clone(), pos.clone(), torch.zeros(B, dtype=torch.long)
        res = torch.full((B, k + 4), -7, dtype=torch.long)
        adv = fn(h, p, drafts, picks, cap, tok, res)
        out += [adv.clone(), res, h, p, tok]
        assert adv.data_ptr() == res.data_ptr() and torch.equal(res[:, 1:k + 2], picks)
        assert (res[:, k + 2:] == -7).all()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    h, p = hist.clone(), pos.clone()
    assert torch.equal(got[0], accept_advance(h, p, drafts, picks, cap))  # the same count without res


def test_lookup_drafts_into_a_view_of_the_verify_ids():
    g = torch.Generator().manual_seed(5)
    hist = torch.randint(0, 4, (3, 30), generator=g)
    last = torch.tensor([29, 12, 3])
    ids = torch.full((3, 7), -1, dtype=torch.long)
    out = lookup_drafts(hist, last, 5, out=ids[:, 1:6])
    assert out.data_ptr() == ids[:, 1:6].data_ptr() and torch.equal(out, lookup(hist, last, 5))
    assert (ids[:, 0] == -1).all() and (ids[:, 6] == -1).all()
    with pytest.raises(ValueError, match="unit column stride"):
        lookup_drafts(hist, last, 3, out=ids[:, ::2][:, :3])
    with pytest.raises(ValueError, match="out must be"):
        lookup_drafts(hist, last, 3, out=ids[:, 1:3])
    with pytest.raises(ValueError, match="res_BK2 must be"):
        accept_advance(hist, last.clone(), ids[:, :2], ids[:, :3], last + 5, None, torch.zeros(3, 3, dtype=torch.long))


def test_accept_advance_all_and_none_accepted():
    g = torch.Generator().manual_seed(0)
    k, B, S = 5, 3, 40
    hist, pos, drafts, picks = _accept_case(g, B, k, S, agree=[k, 0, k])
    cap = pos + 30
    h, p = hist.clone(), pos.clone()
    adv = accept_advance(h, p, drafts, picks, cap)
    assert adv.tolist() == [k + 1, 1, k + 1] and torch.equal(p, pos + adv)
    for b in range(B):
        assert h[b, pos[b] + 1:pos[b] + 1 + adv[b]].tolist() == picks[b, :adv[b]].tolist()
        assert torch.equal(h[b, pos[b] + 1 + adv[b]:], hist[b, pos[b] + 1 + adv[b]:])


def test_launchers_check_their_inputs():
    hist, last = torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="hist_BS must be int64"):
        lookup_drafts(hist.int(), last, 2)
    with pytest.raises(ValueError, match="last_B must be"):
        lookup_drafts(hist, last[:1], 2)
    with pytest.raises(ValueError, match="k must be an int"):
        lookup_drafts(hist, last, 17)
    with pytest.raises(ValueError, match="n_min <= n_max"):
        lookup_drafts(hist, last, 2, 2, 3)
    drafts, picks = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="picks_BK1 must be"):
        accept_advance(hist, last.clone(), drafts, picks[:, :3], last + 5)
    with pytest.raises(ValueError, match="cap_B must be"):
        accept_advance(hist, last.clone(), drafts, picks, (last + 5).float())
    with pytest.raises(ValueError, match="drafts_BK must hold"):
        accept_advance(hist, last.clone(), torch.zeros(2, 17, dtype=torch.long), picks, last + 5)


def test_cpu_without_interpreter_runs_the_twins(monkeypatch):
    g = torch.Generator().manual_seed(1)
    hist, last = torch.randint(0, 3, (3, 30), generator=g), torch.tensor([5, 29, 0])
    monkeypatch.setattr(runtime, "INTERPRET", False)
    assert torch.equal(lookup_drafts(hist, last, 4), lookup(hist, last, 4))
    h, p = hist.clone(), last.clone()
    adv = accept_advance(h, p, hist[:, :2], hist[:, :3], last + 9)
    assert torch.equal(p, last + adv)


def test_engine_tokens_are_the_same_with_the_step_kernels():
    """Greedy generation through the kernels (interpreter) gives the torch path's tokens and kept drafts."""
    model = tiny_model("olmoe", seed=0, num_hidden_layers=1)[1]
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 3]]
    outs = []
    for on in (False, True):
        spec = SpeculativeEngine(model, PromptLookup(), k=4, max_batch=2, max_seq=40, step_kernels=on)
        assert spec.step_kernels is on and (spec.drafter.kernel is not None) is on
        outs.append(spec.generate(prompts, 12))
    assert outs[0].tokens == outs[1].tokens and outs[0].extra["accepted"] == outs[1].extra["accepted"]
    assert all(len(t) == 12 for t in outs[1].tokens) and sum(map(sum, outs[1].extra["accepted"])) > 0


def test_replay_keeps_the_recorded_drafts_with_the_step_kernels():
    """A replay (a drafter with ``forced``) through the kernels: the recorded tokens and kept drafts."""
    from dispatch_book.bench.speculative import ReplayDrafter
    from dispatch_book.spec_study import lookup_runs

    model = tiny_model("olmoe", seed=0, num_hidden_layers=1)[1]
    prompt = [5, 6, 7, 5, 6, 7, 5, 6, 9, 5, 6]
    rec = SpeculativeEngine(model, PromptLookup(), k=3, max_seq=40).generate([prompt], 14)
    runs = lookup_runs(prompt, rec.tokens[0], 3)
    other = tiny_model("olmoe", seed=1, num_hidden_layers=1)[1]
    replay = SpeculativeEngine(other, ReplayDrafter([prompt], rec.tokens, [runs], PromptLookup()), k=3, max_seq=40,
                               step_kernels=True)
    out = replay.generate([prompt], 14)
    assert out.tokens == rec.tokens and out.extra["accepted"] == rec.extra["accepted"]
    assert sum(map(sum, rec.extra["accepted"])) > 0
