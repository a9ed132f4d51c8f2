"""End to end: an OLMoE-1B-7B-config model decoding, every transformers path against the engine.

    python -m dispatch_book.bench e2e --out DIR [--batches 1,8,64,256 --prompt 128 --new 64]

Model: ``OlmoeForCausalLM`` with OLMoE-1B-7B's config and random weights in bf16 (fp16 below sm_80), greedy,
prompts of ``--prompt`` random tokens. Contestants (one run, same model):

    hf_eager / hf_grouped_mm / hf_batched_mm   ``generate()`` with that experts implementation
    hf_compile_static   ``generate(cache_implementation="static")`` (transformers compiles the step)
    hf_graph            transformers' decode step (static cache) captured in a CUDA graph by hand
    hf_graph_dispatch   the same with this package's experts (``experts_implementation="dispatch"``)
    ours                ``dispatch.engine.Engine`` (lean forward, one CUDA graph per batch bucket)
    ours_cublas_sdpa    the same with the decode step's projections on cuBLAS and its attention on
                        SDPA (``decode_kernels=False``): what the GEMV and attention kernels add
    ours_no_pdl         the same engine with plain launches (no programmatic dependent launch,
                        ``dispatch.kernels.pdl``): what overlapping the kernels' starts adds
    ours_fused_moe      at batch 1, the engine with the MoE layer in three launches
                        (``fused_moe=True``: router + top-K, up, down + combine)
    ours_int8 / ours_fp8   the same with the experts quantized (int8-channel / fp8-channel, chapter 7;
                        fp8 only on sm_89+), at batch 1 and 64 (``QUANT_BATCHES``)

Per row: decode tok/s (rows × steps / s), prefill tok/s, time to first token, peak memory, and
% of the bandwidth roofline = bytes one decode step must read (attention and router weights, the
experts the batch is expected to touch under uniform routing, lm_head, the KV cache at the mean
context) ÷ measured HBM read bandwidth. transformers paths are timed as generate(N) − generate(1)
over N − 1 steps; slow ones get fewer new tokens (``--hf-new``). A wall-clock budget skips what no
longer fits (recorded, never silent). ``--profile``: a per-step profile before and after capture.
"""
from __future__ import annotations

import argparse
import time

import torch

from dispatch import runtime
from dispatch_book import bench

GENERATE = ("hf_eager", "hf_grouped_mm", "hf_batched_mm", "hf_compile_static")
QUANT = {"ours_int8": "int8-channel", "ours_fp8": "fp8-channel"}
QUANT_BATCHES = (1, 64)
# In the order they run (each over every batch size): a spent budget skips the last ones first.
CONTESTANTS = ("ours", "ours_no_pdl", "ours_cublas_sdpa", "ours_fused_moe", "ours_int8", "ours_fp8",
               "hf_graph_dispatch", "hf_graph", "hf_grouped_mm", "hf_batched_mm", "hf_eager", "hf_compile_static")


def read_gbps() -> tuple[float, str]:
    """HBM read bandwidth: ``bench.ceilings()`` (measured or datasheet), else measured here as the
    ceiling is (``peaks``' read, over 2 GiB)."""
    from dispatch_book.bench import peaks

    try:
        c = bench.ceilings()
        return float(c["hbm_read_gbps"]), str(c["source"])
    except ValueError:  # a GPU with neither a recording nor a datasheet entry
        pass
    read = peaks.read_rows(2 << 30)[0]
    return read["GBps"], f"measured in this run over 2 GiB: {read['what']}"


def step_bytes(cfg, B: int, ctx: float, itemsize: int) -> dict:
    """Bytes one decode step of B rows at mean context ``ctx`` must read (see the module docstring)."""
    H, L, E, K, I = cfg.hidden_size, cfg.num_hidden_layers, cfg.num_experts, cfg.num_experts_per_tok, \
        cfg.intermediate_size
    kv = cfg.num_key_value_heads * (H // cfg.num_attention_heads)
    attn = L * (2 * H * H + 2 * H * kv + 3 * H + kv) * itemsize  # q, o, k, v; 2 layer norms, q and k norms
    used = E * (1 - (1 - K / E) ** B)  # distinct experts B uniform tokens touch
    experts = L * (used * 3 * H * I + E * H) * itemsize
    head = cfg.vocab_size * H * itemsize
    cache = B * L * 2 * kv * ctx * itemsize
    return {"attention": attn, "experts_and_router": experts, "lm_head": head, "kv_cache": cache,
            "total": attn + experts + head + cache, "experts_used_per_layer": used}


def build(seed: int = 0, **overrides):
    """OLMoE-1B-7B's published config (expert intermediate 1024; ``OlmoeConfig()``'s default is 2048)
    with random weights, on the GPU in the runtime's dtype."""
    from transformers import OlmoeForCausalLM

    from dispatch.hf import hub_config

    torch.manual_seed(seed)
    cfg = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    with torch.device("cuda"):
        model = OlmoeForCausalLM(cfg).to(runtime.compute_dtype()).eval()
    return model


def _peak_reset():
    import gc

    gc.collect()  # graphs, caches and engines of the previous contestant
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def hf_generate(model, ids, new: int, impl: str, static: bool) -> dict:
    model.set_experts_implementation(impl)
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None, attention_mask=torch.ones_like(ids))
    if static:
        kw["cache_implementation"] = "static"
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, **kw)  # warm-up (and compile, for the static cache)
        graphs = _compiled_graphs()
        t1 = _timed(lambda: model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw))
        tn = _timed(lambda: model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw))
        graphs = _compiled_graphs() - graphs
    B, S = ids.shape
    rate = B * (new - 1) / max(tn - t1, 1e-9)
    row = {"ttft_s": t1, "prefill_tok_s": B * S / t1, "new_tokens": new}
    if graphs:  # not a steady state: the timed calls were compiling, so this is no decode speed
        return row | {"status": f"recompiling: torch.compile built {graphs} new graphs during the timed "
                                f"generate calls", "tok_s_while_compiling": rate}
    return row | {"decode_tok_s": rate}


def _compiled_graphs() -> int:
    """How many graphs torch.compile has built in this process (dynamo's own counter)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def hf_graph(model, ids, new: int, impl: str) -> dict:
    """transformers' forward, one token per row, over a StaticCache, captured once and replayed."""
    from transformers import StaticCache

    from dispatch.timing import capture_graph

    model.set_experts_implementation(impl)
    B, S = ids.shape
    cache = StaticCache(config=model.config, max_cache_len=S + new + 4)
    tok = torch.zeros(B, 1, dtype=torch.long, device="cuda")
    pos = torch.zeros(B, 1, dtype=torch.long, device="cuda")

    def step():
        logits = model(input_ids=tok, position_ids=pos, past_key_values=cache, use_cache=True).logits
        tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        pos.add_(1)

    def prefill():
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits
        tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        pos.fill_(S)

    with torch.no_grad():
        t_pre = _timed(prefill)
        g = capture_graph(step, warmup=2)
        cache.reset()
        t_pre = _timed(prefill)  # again, on the reset cache: the timed prefill
        t_dec = _timed(lambda: [g.replay() for _ in range(new - 1)])
    return {"ttft_s": t_pre, "prefill_tok_s": B * S / t_pre, "decode_tok_s": B * (new - 1) / t_dec,
            "new_tokens": new, "graph_step_ms": t_dec / (new - 1) * 1e3}


def ours(lean, ids, new: int) -> dict:
    from dispatch.engine import Engine

    prompts = ids.tolist()
    engine = Engine(lean, max_batch=len(prompts), max_seq=len(prompts[0]) + new)
    engine.generate(prompts, 4)  # captures this bucket's graph, warms the prefill path
    res = engine.generate(prompts, new)
    return {"ttft_s": res.ttft_s, "prefill_tok_s": res.prefill_tok_s, "decode_tok_s": res.decode_tok_s,
            "new_tokens": new, "graph_step_ms": res.decode_s / max(res.decode_steps, 1) * 1e3}


def quantized_lean(model, scheme: str):
    """The engine's model with ``scheme``'s experts (the transformers model is left as it is)."""
    from dispatch.engine import LeanModel
    from dispatch.engine.quant import check_device
    from dispatch.quant import quantize_model

    check_device(scheme, model.device)  # fp8 below sm_89: a recorded error, not a crash
    return LeanModel.from_hf(model, quantized=quantize_model(model, scheme))


def profiles(model, lean, B: int) -> list[dict]:
    """Per-step profile of the engine's step, eager then as a graph replay, and transformers' eager step."""
    from dispatch.engine import Engine, LeanModel
    from dispatch.engine.profile import step_profile

    engine = Engine(lean, max_batch=B, max_seq=512)
    g = torch.Generator().manual_seed(1)  # distinct rows: a repeated prompt would route every row alike
    engine.generate(torch.randint(2, model.config.vocab_size, (B, 16), generator=g).tolist(), 2)
    rows = [{"what": "ours, eager step", **step_profile(lambda: engine._step(B, True))},
            {"what": "ours, CUDA graph", **step_profile(lambda: engine._run_step(B, True))}]
    # With PDL a kernel starts early and waits: its recorded time includes the wait, so the kinds of
    # the graph above overlap. The same graph captured with plain launches attributes the time.
    from dispatch.kernels import pdl

    plain = Engine(lean, max_batch=B, max_seq=512)
    with pdl.disabled():
        plain.generate(torch.randint(2, model.config.vocab_size, (B, 16), generator=g).tolist(), 2)
    rows.append({"what": "ours, CUDA graph, plain launches", **step_profile(lambda: plain._run_step(B, True))})
    if B == 1:  # the same graph unfused: glue as torch ops, the MoE layer in 5 launches
        unfused = Engine(LeanModel.from_hf(model, fused=False), max_batch=B, max_seq=512)
        unfused.generate(torch.randint(2, model.config.vocab_size, (B, 16), generator=g).tolist(), 2)
        rows.append({"what": "ours, CUDA graph, unfused", **step_profile(lambda: unfused._run_step(B, True))})
        del unfused
    from transformers import StaticCache

    model.set_experts_implementation("dispatch")
    cache = StaticCache(config=model.config, max_cache_len=512)
    tok = torch.zeros(B, 1, dtype=torch.long, device="cuda")
    with torch.no_grad():
        model(input_ids=tok, past_key_values=cache, use_cache=True)
        pos = torch.ones(B, 1, dtype=torch.long, device="cuda")
        rows.append({"what": "transformers step (dispatch experts), eager",
                     **step_profile(lambda: model(input_ids=tok, position_ids=pos, past_key_values=cache))})
    return [{"batch": B, **r} for r in rows]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench e2e")
    ap.add_argument("--batches", default="1,8,64,256", type=bench.int_list)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--hf-new", type=int, default=16, help="new tokens for the slow transformers paths")
    ap.add_argument("--contestants", default=",".join(CONTESTANTS))
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    unknown = [n for n in a.contestants.split(",") if n not in CONTESTANTS]
    if unknown:
        ap.error(f"unknown contestant {', '.join(map(repr, unknown))}; choose from {', '.join(CONTESTANTS)}")
    if not runtime.HAS_CUDA:
        raise SystemExit("the end-to-end benchmark runs on a CUDA GPU")

    from dispatch.engine import LeanModel, register

    t_start = time.perf_counter()
    register()
    batches = list(a.batches)
    model = build()
    gbps, gbps_source = read_gbps()
    lean = LeanModel.from_hf(model)  # shares the weights; only the fused QKV is a copy
    g = torch.Generator().manual_seed(0)
    rows, extra = [], {"read_gbps": gbps, "read_gbps_source": gbps_source, "prompt": a.prompt,
                       "model": "OlmoeForCausalLM, OLMoE-1B-7B config, random weights", "dtype": str(lean.dtype)}
    prompts = {B: torch.randint(2, model.config.vocab_size, (B, a.prompt), generator=g).cuda() for B in batches}
    for name in a.contestants.split(","):
        for B in batches:
            ids = prompts[B]
            left = a.budget_s - (time.perf_counter() - t_start)
            row = {"contestant": name, "batch": B}
            slow = name in ("hf_eager", "hf_compile_static") or (name == "hf_batched_mm" and B > 8)
            new = min(a.hf_new, a.new) if name in GENERATE else a.new
            if (name in QUANT and B not in QUANT_BATCHES) or (name == "ours_fused_moe" and B != 1):
                continue
            if left < (60 if slow else 15):
                row["skipped"] = f"wall-clock budget ({a.budget_s:.0f} s) spent: {left:.0f} s left"
            elif name == "hf_compile_static" and B > 8:
                row["skipped"] = "recompiles per layer (dynamo's recompile limit): minutes per batch size"
            else:
                _peak_reset()
                try:
                    if name == "ours":
                        row.update(ours(lean, ids, a.new))
                    elif name == "ours_no_pdl":
                        from dispatch.kernels import pdl

                        with pdl.disabled():  # its graphs are captured with plain launches
                            row.update(ours(lean, ids, a.new))
                    elif name == "ours_cublas_sdpa":
                        row.update(ours(LeanModel.from_hf(model, decode_kernels=False), ids, a.new))
                    elif name == "ours_fused_moe":  # batch 1 only: router + top-K and down + combine fused
                        row.update(ours(LeanModel.from_hf(model, fused_moe=True), ids, a.new))
                    elif name in QUANT:
                        row.update(ours(quantized_lean(model, QUANT[name]), ids, a.new))
                        row["bytes_note"] = "roofline counted in bf16 expert bytes"
                    elif name.startswith("hf_graph"):
                        row.update(hf_graph(model, ids, a.new, "dispatch" if name.endswith("dispatch")
                                            else "grouped_mm"))
                    else:
                        impl = {"hf_compile_static": "grouped_mm"}.get(name, name.removeprefix("hf_"))
                        row.update(hf_generate(model, ids, new, impl, static=name == "hf_compile_static"))
                    row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
                    sb = step_bytes(model.config, B, a.prompt + a.new / 2, lean.dtype.itemsize)
                    row["bytes_per_step"] = sb["total"]
                    row["roofline_tok_s"] = B / (sb["total"] / (gbps * 1e9))
                    if "decode_tok_s" in row:
                        row["pct_roofline"] = 100 * row["decode_tok_s"] / row["roofline_tok_s"]
                except Exception as e:  # recorded, e.g. batched_mm's out-of-memory in prefill
                    row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                    torch.cuda.empty_cache()
            rows.append(row)
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
            bench.save("e2e", rows, extra=extra)
        if name == "ours" and a.profile:  # its own recording: e2e_profile
            prof = profiles(model, lean, 1) + profiles(model, lean, 64)
            for r in prof:
                print({k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
            bench.save("e2e_profile", prof, extra={k: extra[k] for k in ("model", "dtype", "prompt")})
    print("wrote", bench.save("e2e", rows, extra=extra))
