"""The serving engine's promise: a greedy request generates the same tokens whatever runs beside it
— alone, in a continuous batch with chunked prefill, after preemption, through shared prefix blocks —
and the same as chapter 6's static engine. CPU, fp32 (the shipped model; tiny transformers models
for GQA and for the Triton kernels under the interpreter). Exact token equality; where a random tiny
model's two best logits are closer than MARGIN, a difference there is a near tie, not a bug."""
import pytest
import torch

from dispatch.engine import Engine, LeanModel
from dispatch.hf import tiny_model
from dispatch.serve import EngineConfig, LLMEngine, QueueFull, RequestParams

PROMPTS = ["def main(", "import os\n", "class Foo:", "for i in range(", "    return ", "x = [", "# compute",
           "if __name__ == '__main__':\n    main()\n    print(", "with open(path) as f:\n    for line in f:"]
MARGIN = 1e-4  # fp32 logits: a reordered sum moves them ~1e-6


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices: one thread is faster, and far faster on a shared, busy CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def shipped():
    from dispatch.train import load

    loaded = load("cpu")
    return loaded.model, loaded.tokenizer, [loaded.tokenizer(p)["input_ids"] for p in PROMPTS]


def static_tokens(model, prompts, n, stop=(0,)):
    eng = Engine(model, max_batch=1, max_seq=max(len(p) for p in prompts) + n)
    return [eng.generate([p], n, stop_tokens=stop).tokens[0] for p in prompts]


def same_greedy(ours, ref, ref_margins):
    """Equal, or equal up to a step where the reference's top two logits were within MARGIN."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if a != b:
            return ref_margins[i] < MARGIN
    return len(ours) == len(ref)


@pytest.mark.parametrize("config", [
    dict(max_seqs=4, max_step_tokens=8, block_size=4),  # chunked prefill riding along with decode rows
    dict(max_seqs=9, max_step_tokens=64, block_size=16, chunked_prefill=False),
    dict(max_seqs=9, max_step_tokens=6, block_size=2, num_blocks=40, max_model_len=64),  # few blocks: preemption
])
def test_batched_greedy_equals_alone_and_static(shipped, config):
    model, tok, prompts = shipped
    lengths = [20, 7, 33, 1, 12, 25, 9, 16, 30]
    params = [RequestParams(max_tokens=n) for n in lengths]
    eng = LLMEngine(model, EngineConfig(**config))
    outs = eng.generate(prompts, params)
    ref = static_tokens(model, prompts, max(lengths))
    for o, r, n in zip(outs, ref, lengths, strict=True):
        assert o.tokens == r[:n]
        assert o.finish_reason == ("stop" if len(r) <= n and r[-1] == 0 else "length")
    alone = LLMEngine(model, EngineConfig(max_seqs=1))
    assert [alone.generate([p], q)[0].tokens for p, q in zip(prompts, params, strict=True)] == [o.tokens for o in outs]
    assert eng.stats["blocks_used"] == 0 and not eng.requests
    assert eng.alloc.num_free == eng.alloc.num_blocks and not eng.runner.row_of


def test_preemption_happens_and_changes_nothing(shipped):
    model, _, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=9, max_step_tokens=32, block_size=2, num_blocks=64))
    seen = []
    orig = eng.scheduler._preempt
    eng.scheduler._preempt = lambda s: (seen.append(s.id), orig(s))
    outs = eng.generate(prompts, RequestParams(max_tokens=40, ignore_eos=True))
    assert seen, "the cache was meant to run out"
    ref = LLMEngine(model, EngineConfig(max_seqs=9)).generate(prompts, RequestParams(max_tokens=40, ignore_eos=True))
    assert [o.tokens for o in outs] == [r.tokens for r in ref]
    assert eng.alloc.num_free == eng.alloc.num_blocks


def test_shared_prefix_is_stored_once(shipped):
    model, tok, _ = shipped
    head = tok("import os\nimport sys\nimport json\n\n\ndef load(path):\n")["input_ids"]
    prompts = [head + tok(t)["input_ids"] for t in ("    return", "    with", "    x =")]
    eng = LLMEngine(model, EngineConfig(max_seqs=4, block_size=4))
    first = eng.generate(prompts[:1], RequestParams(max_tokens=8))
    rest = eng.generate(prompts[1:], RequestParams(max_tokens=8))
    assert eng.alloc.hits >= 2 * (len(head) // 4) * 4  # both later prompts took the head's full blocks
    plain = LLMEngine(model, EngineConfig(max_seqs=4, block_size=4, prefix_caching=False))
    assert [o.tokens for o in first + rest] == [o.tokens for o in plain.generate(prompts, RequestParams(max_tokens=8))]


def test_sampled_request_does_not_depend_on_its_neighbours(shipped):
    model, _, prompts = shipped
    p = RequestParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=3)
    eng = LLMEngine(model, EngineConfig(max_seqs=8, max_step_tokens=16))
    alone = eng.generate([prompts[0]], p)[0].tokens
    crowd = eng.generate(prompts[:6], [p] + [RequestParams(max_tokens=12, temperature=1.0, seed=s) for s in range(5)])
    assert crowd[0].tokens == alone
    other = eng.generate([prompts[0]], RequestParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=4))[0].tokens
    assert other != alone  # another seed, other draws


def test_stops(shipped):
    model, tok, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=4), tokenizer=tok)
    free = eng.generate([prompts[3]], RequestParams(max_tokens=30, ignore_eos=True))[0]
    assert free.finish_reason == "length" and len(free.tokens) == 30
    stop_tok = free.tokens[5]
    o = eng.generate([prompts[3]], RequestParams(max_tokens=30, stop_token_ids=(stop_tok,), ignore_eos=True))[0]
    assert o.finish_reason == "stop" and o.tokens == free.tokens[:free.tokens.index(stop_tok) + 1]
    text = tok.decode(free.tokens, skip_special_tokens=True)
    needle = text[len(text) // 2:len(text) // 2 + 3]
    rid = eng.add_request(prompts[3], RequestParams(max_tokens=30, stop=(needle,), ignore_eos=True))
    last = None
    while eng.has_work():
        last = {o.id: o for o in eng.step()}.get(rid, last)
    text = tok.decode(last.tokens, skip_special_tokens=True)
    assert last.finish_reason == "stop" and last.stop_at == text.find(needle)


def test_logprobs_and_margins(shipped):
    """logprobs=k: the chosen token's log-probability and the k best; for greedy the best is the token,
    and log p1 - log p2 is the logit margin the engine records (the normaliser cancels)."""
    model, _, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=4), record_margins=True)
    rid = eng.add_request(prompts[2], RequestParams(max_tokens=10, logprobs=3))
    plain = eng.add_request(prompts[3], RequestParams(max_tokens=10))
    got, margins = [], eng.requests[rid].margins
    while eng.has_work():
        for o in eng.step():
            assert (o.logprobs is None) == (o.id == plain)
            if o.id == rid:
                got += list(zip(o.new_tokens, o.logprobs, strict=True))
    assert len(got) == 10
    for (tok, (own, top)), m in zip(got, margins, strict=True):
        assert len(top) == 3 and top[0][0] == tok and own == top[0][1] <= 0.0
        assert top[0][1] >= top[1][1] >= top[2][1]
        assert abs((top[0][1] - top[1][1]) - m) <= 1e-4
    with pytest.raises(ValueError, match="logprobs"):
        RequestParams(logprobs=21)


def test_abort_frees_blocks_at_once(shipped):
    model, _, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=4, block_size=4))
    a = eng.add_request(prompts[0], RequestParams(max_tokens=50))
    b = eng.add_request(prompts[1], RequestParams(max_tokens=50))
    for _ in range(3):
        eng.step()
    held = eng.alloc.num_used
    out = eng.abort(a)
    assert out.finish_reason == "abort" and eng.alloc.num_used < held
    eng.abort(b)
    assert eng.alloc.num_used == 0 and not eng.has_work() and eng.abort(b) is None
    w = eng.add_request(prompts[2], RequestParams(max_tokens=5))  # aborted while waiting: nothing held
    eng.abort(w)
    assert not eng.has_work() and eng.alloc.num_used == 0


def test_each_step_runs_the_experts_on_its_real_token_count(shipped, monkeypatch):
    """The MoE layer sees the whole mixed step: dispatch.moe picks its path from that T."""
    import importlib

    moe_module = importlib.import_module("dispatch.moe")  # (the package exports the function as dispatch.moe)
    model, _, prompts = shipped
    seen, orig = [], moe_module.pick_path
    monkeypatch.setattr(moe_module, "pick_path", lambda x, *a, **k: (seen.append(x.shape[0]), orig(x, *a, **k))[1])
    eng = LLMEngine(model, EngineConfig(max_seqs=4, max_step_tokens=8))
    eng.generate(prompts[:5], RequestParams(max_tokens=6))
    L = model.config.num_hidden_layers
    assert seen == [t for t in eng.step_tokens for _ in range(L)]
    assert len(set(eng.step_tokens)) > 1 and max(eng.step_tokens) == 8  # mixed steps filled the budget


def test_warmup_leaves_nothing_behind(shipped):
    model, _, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=2))
    eng.warmup()
    assert eng.steps == 0 and eng.alloc.num_used == 0 and not eng.has_work() and not eng.requests
    eng.add_request(prompts[0])
    with pytest.raises(RuntimeError, match="before adding requests"):
        eng.warmup()


def test_step_log_keeps_the_latest_steps(shipped, monkeypatch):
    from dispatch.serve import engine as engine_mod

    model, _, prompts = shipped
    monkeypatch.setattr(engine_mod, "STEP_LOG", 3)  # a server runs for days: the log must not grow without end
    eng = LLMEngine(model, EngineConfig(max_seqs=2))
    eng.generate(prompts[:2], RequestParams(max_tokens=5))
    assert eng.steps >= 5 and len(eng.step_log) == 3
    assert all(s.decode_rows + s.prefill_tokens == s.tokens > 0 and s.seconds > 0 for s in eng.step_log)


def test_warmup_lengths_cover_each_class_of_step():
    """Every token count a step can have finds a warm-up length of its class: the same power-of-two
    bucket at or above it, the same tile-table bucket (``tables.nearest_bucket`` over a table's powers of
    two), the same side of each crossover, the same kinds of integers (1, a multiple of 16, other) for T
    and T·K — the step a real request brings compiles nothing."""
    from dispatch.serve.engine import warmup_lengths
    from dispatch.tables import nearest_bucket

    def kind(x):
        return 1 if x == 1 else 16 if x % 16 == 0 else 0

    table = {str(1 << i): {"b": 1 << i} for i in range(15)}  # a tuned table's buckets, 1 .. 16384

    def cls(T, routed, crossovers):
        return (1 << (T - 1).bit_length(), nearest_bucket(table, T)["b"], *(T <= c for c in crossovers), kind(T),
                *(kind(T * m) for m in routed))

    # T = 10: T other, 10·8 = 80 a multiple of 16; 12 and 13 take the table's bucket 16, 9 and 10 its 8
    assert warmup_lengths(16, (8,)) == [1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 13, 16]
    assert warmup_lengths(16) == [1, 2, 3, 5, 6, 9, 12, 16]
    assert 24 in warmup_lengths(32, (), (23,)) and 24 not in warmup_lengths(32)  # the grouped GEMM from 24
    for top, routed, crossovers in ((64, (8,), (16,)), (300, (6, 8), (24, 64)), (2048, (2,), ()),
                                    (2048, (8, 9), (64,))):
        got = warmup_lengths(top, routed, crossovers)
        assert max(got) <= top and len(got) == len(set(got)) and len(got) <= 8 * top.bit_length() * len(routed)
        keys = {cls(n, routed, crossovers) for n in got}
        assert all(cls(T, routed, crossovers) in keys for T in range(1, top + 1))


def test_bad_requests_and_configs(shipped):
    model, _, prompts = shipped
    eng = LLMEngine(model, EngineConfig(max_seqs=2, max_waiting=2))
    ctx = eng.max_model_len
    for prompt, params, match in (([], RequestParams(), "at least one token"), ([5000], RequestParams(), "ints in"),
                                  ([1] * ctx, RequestParams(), "context"),
                                  ([1] * 10, RequestParams(max_tokens=ctx), "exceeds the context")):
        with pytest.raises(ValueError, match=match):
            eng.add_request(prompt, params)
    for kw, match in ((dict(max_tokens=0), "max_tokens"), (dict(temperature=-1), "temperature"),
                      (dict(top_p=0), "top_p"), (dict(stop="x"), "stop")):
        with pytest.raises(ValueError, match=match):
            RequestParams(**kw)
    eng.add_request(prompts[0])
    eng.add_request(prompts[1])
    with pytest.raises(QueueFull):
        eng.add_request(prompts[2])
    with pytest.raises(ValueError, match="cannot hold one sequence"):
        LLMEngine(model, EngineConfig(num_blocks=2, block_size=4))
    with pytest.raises(ValueError, match="kv_fraction"):
        EngineConfig(kv_fraction=1.5)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_gqa_families_equal_static(family):
    _, model = tiny_model(family)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (3, 17, 9, 1)]
    outs = LLMEngine(model, EngineConfig(max_seqs=4, max_step_tokens=8, block_size=4), eos_token_ids=(),
                     record_margins=True).generate(prompts, RequestParams(max_tokens=12))
    alone = LLMEngine(model, EngineConfig(max_seqs=1), eos_token_ids=(), record_margins=True)
    for p, o in zip(prompts, outs, strict=True):
        ref = alone.generate([p], RequestParams(max_tokens=12))[0]
        assert same_greedy(o.tokens, ref.tokens, ref.margins)
        assert same_greedy(o.tokens, static_tokens(model, [p], 12, stop=())[0], ref.margins)


def test_triton_kernels_under_the_interpreter_equal_the_twins():
    """Paged attention kernels and chapter 6's fused glue (interpreter, fp32) against the torch step."""
    _, model = tiny_model("olmoe")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (5, 11, 2)]
    cfg = dict(max_seqs=3, max_step_tokens=6, block_size=4)
    ref = LLMEngine(model, EngineConfig(**cfg), eos_token_ids=(), record_margins=True).generate(
        prompts, RequestParams(max_tokens=6))
    fused = LeanModel.from_hf(model, fused=True, decode_kernels=False)
    outs = LLMEngine(fused, EngineConfig(**cfg, kernels=True, max_model_len=64), eos_token_ids=()).generate(
        prompts, RequestParams(max_tokens=6))
    for o, r in zip(outs, ref, strict=True):
        assert same_greedy(o.tokens, r.tokens, r.margins)


def staggered(eng, prompts, params, every: int = 2) -> list[list[int]]:
    """Request i added at step every·i (as a server's arrivals come), run to the end; tokens per request."""
    ids, outs, step = [], {}, 0
    while len(ids) < len(prompts) or eng.has_work():
        while len(ids) < len(prompts) and step >= every * len(ids):
            ids.append(eng.add_request(prompts[len(ids)], params))
        for o in eng.step():
            if o.finished:
                outs[o.id] = o.tokens
        step += 1
    return [outs[i] for i in ids]


def test_cached_prompt_tails_with_decode_rows_stay_inside_their_tensors():
    """The steps a server sees once its prompts repeat: each prompt's cached blocks taken, its short tail
    computed as a chunk beside other rows' decode steps, in a pool small enough to preempt — through the
    Triton kernels under the interpreter with every load and store bounds-checked (dispatch_book.bounds),
    the same tokens as the first time and as the twins."""
    from dispatch_book import bounds

    _, model = tiny_model("olmoe")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (9, 17, 6, 13)]
    cfg = dict(max_seqs=4, max_step_tokens=12, block_size=4, num_blocks=10, max_model_len=32)
    params = RequestParams(max_tokens=12, ignore_eos=True)
    ref = LLMEngine(model, EngineConfig(**cfg), eos_token_ids=(), record_margins=True).generate(prompts, params)
    fused = LeanModel.from_hf(model, fused=True, decode_kernels=False)
    eng = LLMEngine(fused, EngineConfig(**cfg, kernels=True), eos_token_ids=())
    preempted = []
    orig = eng.scheduler._preempt
    eng.scheduler._preempt = lambda seq: (preempted.append(seq.id), orig(seq))
    with bounds.checking():
        first = staggered(eng, prompts, params)
        hits, n0 = eng.alloc.hits, eng.steps
        again = staggered(eng, prompts, params)
    mixed = [s for s in list(eng.step_log)[n0:] if s.decode_rows and s.prefill_tokens]
    assert eng.alloc.hits > hits and len(mixed) >= 2 and preempted, "cached tails beside decode rows, preemption"
    assert again == first
    for o, r in zip(first, ref, strict=True):
        assert same_greedy(o, r.tokens, r.margins)
    assert eng.alloc.num_free == eng.alloc.num_blocks
