"""Chapter 9's benchmark: speculative decoding on an MoE, measured.

    python -m dispatch_book.bench speculative --part traces --out results   # CPU: cpu/speculative_traces.json
    python -m dispatch_book.bench speculative --out results                 # GPU: <gpu>/speculative.json

``traces`` (where this Python's standard library is the checkpoint manifest's): the shipped model's
greedy continuations of held-out standard-library prompts; for each, the drafts prompt lookup and
the shipped draft model would keep at every position (``runs``, :mod:`dispatch.serve.spec_cost`);
the routing of those texts (distinct experts per window of w = k+1 tokens); the small model's step
time per k on this CPU. On a GPU, rows by ``kind`` (saved after every row):

    invariance   decode-step ms, default and batch-invariant, batch 1 and 64 (shipped model, OLMoE-1B-7B);
                 on OLMoE also the step's GPU time by kind of kernel in both modes (invariance_profile)
    verify_cost  ms of a speculative step with k drafts, k = 0 … K_MAX, batch 1 (shipped model, presets)
    race         the shipped model, batch 1, the recorded prompts: tokens/s of plain greedy decoding and of
                 speculative decoding (prompt lookup at each fixed k and adaptive, the draft model), and
                 whether every output is token-identical to plain greedy's
    replay       the presets: the recorded accept/reject sequence of each drafter replayed through the real
                 engine — drafts fixed to the recording, verify passes, acceptance and rollbacks run for real
                 (and the drafter's own work: the lookup, or k steps of a one-layer draft of the preset)
    peer         transformers' ``generate`` on the shipped model and prompts: plain, ``prompt_lookup_num_tokens``,
                 ``assistant_model`` (the shipped draft model)
"""
from __future__ import annotations

import argparse
import time

import torch

from dispatch import runtime
from dispatch_book import bench

K_MAX = 8
NEW = 64  # tokens generated per prompt (prompt 64 + 64: the shipped model's trained context of 128)
# The large presets as whole models with random weights; fewer layers where the whole would not fit one
# GPU or the time budget (per-layer work is the same, so is the ratio of a verify step to a decode step).
PRESET_MODELS = {
    "olmoe-1b-7b": ("olmoe", None),
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_experts=128, num_experts_per_tok=8, num_attention_heads=32,
                                        num_key_value_heads=4, head_dim=128, vocab_size=151936, num_hidden_layers=12,
                                        norm_topk_prob=True, max_position_embeddings=4096, rope_theta=1e6)),
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8,
                                     num_experts_per_tok=2, num_attention_heads=32, num_key_value_heads=8,
                                     vocab_size=32000, num_hidden_layers=6, max_position_embeddings=4096,
                                     sliding_window=None, rope_theta=1e6)),
}
FULL_LAYERS = {"olmoe-1b-7b": 16, "qwen3-30b-a3b": 48, "mixtral-8x7b": 32}


def preset_config(name: str, layers: int | None = None):
    """The transformers config of a preset model (``layers`` of them, default the benchmark's)."""
    from transformers import AutoConfig

    from dispatch.hf import hub_config

    family, values = PRESET_MODELS[name]
    cfg = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded") if values is None else \
        AutoConfig.for_model(family, **values)
    if layers is not None:
        cfg.num_hidden_layers = layers
    return cfg


def preset_shape(name: str):
    """The preset's whole model (all its layers) for the byte model (:func:`dispatch.serve.spec_cost.verify_bytes`)."""
    from dispatch.hf import model_shape_from_hf

    return model_shape_from_hf(preset_config(name, FULL_LAYERS[name]))


def build_preset(name: str, layers: int | None = None, seed: int = 0):
    """A preset as a transformers model with random weights, on the GPU, in the runtime's dtype."""
    from transformers import AutoModelForCausalLM

    cfg = preset_config(name, layers)
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return AutoModelForCausalLM.from_config(cfg).to(runtime.compute_dtype()).eval()


class ReplayDrafter:
    """Drafts from a recording: for a recorded prompt, the recorded continuation, its first
    min(k, runs) tokens right and the rest wrong, and ``forced``: the step keeps exactly those and
    emits the recorded tokens. ``inner``: a real drafter run first for its cost (output dropped)."""

    k_min = 0

    def __init__(self, prompts: list[list[int]], continuations: list[list[int]], runs: list[list[int]], inner=None):
        self.prompts, self.conts, self.runs, self.inner = prompts, continuations, runs, inner

    def bind(self, eng) -> None:
        S = eng.hist_BS.shape[1]
        self.text_BS = torch.zeros(eng.max_batch, S, dtype=torch.long, device=eng.dev)
        self.runs_BS = torch.zeros(eng.max_batch, S, dtype=torch.long, device=eng.dev)
        self.V = eng.model.cfg.vocab_size
        if self.inner is not None:
            self.inner.bind(eng)

    def start(self, eng, prompts, B) -> None:
        """Each row's recording (found by its prompt), indexed by position."""
        self.text_BS.zero_()
        self.runs_BS.zero_()
        for b, p in enumerate(prompts):
            i = self.prompts.index(p)  # ValueError for a prompt that was not recorded
            text = p + self.conts[i]
            self.text_BS[b, :len(text)] = torch.tensor(text)
            self.runs_BS[b, len(p):len(text)] = torch.tensor(self.runs[i])  # by position of the last token
            eng.tok_B[b] = eng.hist_BS[b, len(p)] = self.conts[i][0]  # the prefill's token, as recorded
        if self.inner is not None:
            self.inner.start(eng, prompts, B)

    def _recorded(self, eng, B, k):
        pos = eng.pos_B[:B]
        idx = (pos[:, None] + 1 + torch.arange(k + 1, device=eng.dev)).clamp(max=self.text_BS.shape[1] - 1)
        return self.text_BS[:B].gather(1, idx), torch.minimum(self.runs_BS[:B].gather(1, pos[:, None])[:, 0],
                                                              torch.full_like(pos, k))

    def propose(self, eng, B, k, greedy):
        if self.inner is not None:
            self.inner.propose(eng, B, k, greedy)
        truth, n = self._recorded(eng, B, k)
        j = torch.arange(k, device=eng.dev)[None, :]
        return torch.where(j < n[:, None], truth[:, :k], (truth[:, :k] + 1) % self.V), None

    def forced(self, eng, B, k):
        return self._recorded(eng, B, k)


def _restoring(eng, fn):
    """``fn`` (a step) with the rows' positions and last tokens put back first: timed again and again
    at one place of the text."""
    pos, tok = eng.pos_B.clone(), eng.tok_B.clone()

    def run():
        eng.pos_B.copy_(pos)
        eng.tok_B.copy_(tok)
        fn()
    return run


def step_costs(spec, prompts, ks, *, rep: int = 30, rounds: int = 1) -> dict[int, dict]:
    """time_ms of the speculative step with k drafts, for k in ``ks``, after a prefill of ``prompts``.
    ``rounds`` > 1: every k timed once a round, interleaved, and each k's round with the lowest
    ``min_ms`` kept (on a machine shared with other work, the least disturbed measurement)."""
    B = spec.check_request(prompts, 2)
    if spec.graphs:
        for k in ks:
            spec.capture_spec(B, k, True)
    spec.prepare(prompts, spec.limit - max(len(p) for p in prompts))
    spec.cap_B.fill_(spec.max_seq)  # the restored step never stops
    best: dict[int, dict] = {}
    for _ in range(rounds):
        for k in ks:
            t = bench.time_ms(_restoring(spec, lambda k=k: spec._run_spec(B, k, True)), warmup=3, rep=rep)
            if k not in best or t["min_ms"] < best[k]["min_ms"]:
                best[k] = t
    return best


def _decode_ready(eng, prompts) -> int:
    """The plain engine's greedy decode step ready to run: the graph of bucket(len(prompts)) captured
    (on CUDA), then ``prompts`` prefilled. Returns the bucket."""
    from dispatch.engine import SamplingParams, bucket

    B = bucket(len(prompts))
    if eng.graphs:
        eng.capture(B, True)
    eng._prefill(prompts, B, SamplingParams())
    return B


def decode_cost(eng, prompts, *, rep: int = 30, rounds: int = 1) -> dict:
    """time_ms of the plain engine's greedy decode step (a CUDA graph on a GPU) after a prefill of
    ``prompts``; ``rounds``: as :func:`step_costs`."""
    B = _decode_ready(eng, prompts)
    times = [bench.time_ms(_restoring(eng, lambda: eng._run_step(B, True)), warmup=3, rep=rep)
             for _ in range(rounds)]
    return min(times, key=lambda t: t["min_ms"])


def invariance_profile(eng, prompts) -> dict:
    """:func:`dispatch.engine.profile.step_profile` of the decode step :func:`decode_cost` times (µs per
    step by kind of kernel, launch gaps, kernels per step): on CUDA. Its graph is captured again
    without PDL: with it a kernel's programs start early and wait for the one ahead, and that wait
    counts as the kernel's own time (the kinds then sum past the step)."""
    from dispatch.engine.profile import step_profile
    from dispatch.kernels import pdl

    with pdl.disabled():
        eng._graphs.clear()  # and a fresh pool: capturing into one whose graphs are gone is refused
        eng._pool = None
        B = _decode_ready(eng, prompts)
        return step_profile(_restoring(eng, lambda: eng._run_step(B, True)))


def tokens_per_s(outs) -> tuple[float, int, float]:
    """(tokens/s after the first token, tokens, seconds) of a list of Generation, one prompt each."""
    tokens = sum(len(o.tokens[0]) - 1 for o in outs)
    seconds = sum(o.decode_s for o in outs)
    return tokens / seconds, tokens, seconds


def run_each(engine, prompts, new, passes: int = 1):
    """Each prompt alone (batch 1), after a warm-up: one short call, or with ``passes`` > 1 the whole
    set once (an adaptive k meets every draft length it will use, so each one's graph is captured
    before the timing), then the timed pass of median decode time of ``passes``."""
    if passes == 1:
        engine.generate(prompts[:1], 4)
        return [engine.generate([p], new) for p in prompts]
    runs = [[engine.generate([p], new) for p in prompts] for _ in range(passes + 1)][1:]
    return sorted(runs, key=lambda outs: sum(o.decode_s for o in outs))[passes // 2]


def hf_generate(model, prompts: list[list[int]], new: int, **kw) -> tuple[float, list[list[int]]]:
    """transformers' ``generate`` on each prompt alone (greedy, ``new`` tokens, ``kw`` its options:
    ``prompt_lookup_num_tokens=``, ``assistant_model=``): (tokens/s after the first token, the outputs).
    Timed as generate(new) − generate(1), after a warm-up, so the prefill is left out as in ours."""
    from transformers.utils import logging as hf_logging

    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    model.generation_config.pad_token_id = model.generation_config.eos_token_id
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # generate's notes on min_new_tokens, printed on every call
    try:
        return _hf_generate(model, prompts, new, sync, kw)
    finally:
        hf_logging.set_verbosity(verbosity)


def _hf_generate(model, prompts, new, sync, kw):
    secs, tokens, outs = 0.0, 0, []
    for p in prompts:
        ids = torch.tensor([p], device=model.device)
        common = dict(do_sample=False, attention_mask=torch.ones_like(ids), **kw)
        with torch.no_grad():
            model.generate(ids, max_new_tokens=2, **common)
            times = []
            for n in (1, new):
                sync()
                t0 = time.perf_counter()
                out = model.generate(ids, max_new_tokens=n, min_new_tokens=n, **common)[0, len(p):].tolist()
                sync()
                times.append(time.perf_counter() - t0)
        secs += times[1] - times[0]
        tokens += len(out) - 1
        outs.append(out)
    return tokens / secs, outs


def traces_recording():
    doc = bench.load("speculative_traces", gpu="cpu")
    if doc is None:
        raise SystemExit("no results/cpu/speculative_traces.json: record it first (--part traces on a CPU)")
    return doc


def recording(root=None) -> dict | None:
    """The newest GPU recording of this suite (results/<gpu>/speculative.json), or None."""
    from dispatch_book.bench import results, sets

    docs = [d for s in sets.slugs(root) if (d := results.load("speculative", gpu=s, root=root)) is not None]
    return max(docs, key=lambda d: d["date"]) if docs else None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench speculative")
    ap.add_argument("--part", choices=["traces", "gpu"], default="gpu" if runtime.HAS_CUDA else "traces")
    ap.add_argument("--models", default=",".join(["shipped", *PRESET_MODELS]),
                    help="what the GPU part measures; the recording's rows of other models are kept")
    ap.add_argument("--prompts", type=int, default=12, help="held-out prompts of the traces")
    ap.add_argument("--budget-s", type=float, default=500.0)
    a = ap.parse_args(argv)
    if a.part == "traces":
        from dispatch_book.bench.spec_traces import record_traces

        print("wrote", record_traces(a.prompts))
        return
    if not runtime.HAS_CUDA:
        raise SystemExit("the GPU part of the speculative benchmark runs on a CUDA GPU")
    from dispatch_book.bench.spec_record import record_gpu

    models = a.models.split(",")
    unknown = set(models) - {"shipped", *PRESET_MODELS}
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}: shipped, {', '.join(PRESET_MODELS)}")
    record_gpu(models, a.budget_s)
