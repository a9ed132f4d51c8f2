"""Serving many requests: continuous batching against the static engine and transformers.

    python -m dispatch_book.bench serve --out DIR [--parts step,offline,online,reliability]
    python -m dispatch_book.bench serve --url http://host:port --served-model NAME   (any OpenAI server)

Model: on a GPU OLMoE-1B-7B's config with random bf16 weights (``e2e.build``, no end-of-sequence
token: every request runs to its ``max_tokens``), saved once to a folder with a word tokenizer for
the online runs; on a CPU the shipped model, with a tiny workload. Parts (one results file, rows
tagged by ``part``; a run of some parts keeps the file's rows of the others):

    step         a decode-only step, paged (graph replay, and the whole ``LLMEngine.step``) against
                 chapter 6's static engine (graph replay) at the same batch and context
    offline      all requests at once, prompt and output lengths uniform in --offline-prompt/-output:
                 ours, static (one batch at a time), hf_cb and hf_cb_dispatch (transformers'
                 continuous batching with its default experts / ``experts_implementation="dispatch"``)
    online       Poisson arrivals at --rates against ``python -m dispatch.serve`` (ours) and
                 ``transformers serve --continuous-batching`` (hf_serve): TTFT, TPOT, ITL p50/p90/p99,
                 tok/s, goodput within --slo-ttft-ms / --slo-tpot-ms
    reliability  --reliability-n requests to ours, 10 % cut off mid-stream, 5 % malformed: statuses,
                 blocks held afterwards, completed greedy texts against the same prompts sent alone

A contestant that cannot run records ``did_not_run`` with the reason; a spent --budget-s ``skipped``.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import pathlib
import re
import tempfile
import time
import urllib.request

import torch

from dispatch import files, runtime
from dispatch_book import bench
from dispatch_book.bench import results, serve_load, serve_online, serve_peers

PARTS = ("step", "offline", "online", "reliability")
OFFLINE = ("ours", "static", "hf_cb", "hf_cb_dispatch")
ONLINE = ("ours", "hf_serve")


def parse(argv):
    gpu = runtime.HAS_CUDA
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench serve")
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--contestants", default=",".join(dict.fromkeys(OFFLINE + ONLINE)))
    ap.add_argument("--offline-n", type=int, default=256 if gpu else 12)
    ap.add_argument("--offline-prompt", default="100,1024" if gpu else "4,40")
    ap.add_argument("--offline-output", default="100,1024" if gpu else "4,40")
    ap.add_argument("--online-n", type=int, default=64 if gpu else 8)
    ap.add_argument("--online-prompt", default="100,1024" if gpu else "4,40")
    ap.add_argument("--online-output", default="64,256" if gpu else "4,24")
    ap.add_argument("--rates", default="4,8,16,32,64" if gpu else "4,16")
    ap.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    ap.add_argument("--slo-tpot-ms", type=float, default=50.0)
    ap.add_argument("--reliability-n", type=int, default=10000 if gpu else 60)
    ap.add_argument("--step-batches", default="1,16,64,256" if gpu else "1,4")
    ap.add_argument("--step-context", type=int, default=512 if gpu else 48)
    ap.add_argument("--static-batch", type=int, default=128 if gpu else 4)
    ap.add_argument("--max-seqs", type=int, default=256 if gpu else 8)
    ap.add_argument("--max-step-tokens", type=int, default=2048 if gpu else 64)
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--peer-cap-s", type=float, default=90.0 if gpu else 300.0,
                    help="an offline transformers run cut off after this long records its throughput bound")
    ap.add_argument("--url", default=None, help="measure this OpenAI-compatible server online (contestant 'url')")
    ap.add_argument("--served-model", default=None, help="the model name to send to --url")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def _range(text: str) -> tuple[int, int]:
    lo, hi = (int(v) for v in text.split(","))
    return lo, hi


def build_model():
    """(transformers model, tokenizer or None, description): OLMoE-1B-7B random on a GPU, the shipped one on CPU."""
    if runtime.HAS_CUDA:
        from dispatch_book.bench.e2e import build

        model = build()
        model.config.eos_token_id = model.generation_config.eos_token_id = None  # run to max_tokens
        return model, serve_peers.word_tokenizer(model.config.vocab_size), \
            "OlmoeForCausalLM, OLMoE-1B-7B config, random weights"
    from dispatch.train import load

    loaded = load("cpu")
    return loaded.model, loaded.tokenizer, "the shipped CPU model (dispatch/assets/cpu)"


def _free():
    gc.collect()
    if runtime.HAS_CUDA:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def step_rows(lean, batches: list[int], ctx: int, steps: int = 30) -> list[dict]:
    """Decode-only step time (ms): static graph replay, paged graph replay, the whole LLMEngine.step."""
    from dispatch.engine import Engine
    from dispatch.engine.engine import bucket
    from dispatch.serve import EngineConfig, LLMEngine, RequestParams

    rows, sync = [], (torch.cuda.synchronize if runtime.HAS_CUDA else (lambda: None))
    g = torch.Generator().manual_seed(1)
    for B in batches:
        prompts = torch.randint(2, lean.embed.shape[0], (B, ctx), generator=g).tolist()
        seq = ctx + 2 * steps + 16
        # big prefill steps (a few of them): the first rows decode while the last prompts fill, so the
        # contexts stay near ctx, and no row may finish before the timed steps end
        budget = max(2 * B, ctx, B * ctx // 8)
        new = -(-B * ctx // (budget - B)) + 2 * steps + 8
        static = Engine(lean, max_batch=B, max_seq=-(-seq // 16) * 16)
        static.generate(prompts, 2)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            static._run_step(B, True)
        sync()
        t_static = (time.perf_counter() - t0) / steps * 1e3
        del static
        _free()
        cfg = EngineConfig(max_seqs=B, max_step_tokens=budget, max_model_len=-(-(ctx + new) // 16) * 16)
        eng = LLMEngine(lean, cfg, eos_token_ids=())
        eng.warmup()  # every bucket captured before the clock runs
        for p in prompts:
            eng.add_request(p, RequestParams(max_tokens=new, ignore_eos=True))
        while eng.scheduler.waiting or any(s.left > 1 for s in eng.scheduler.running):
            eng.step()  # prefill every prompt; from here on each step is decode-only
        eng.step()
        assert len(eng.scheduler.running) == B, "a row finished before the timed steps"
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            eng.step()
        sync()
        t_engine = (time.perf_counter() - t0) / steps * 1e3
        assert len(eng.scheduler.running) == B, "a row finished inside the timed steps"
        row = {"part": "step", "batch": B, "context": ctx, "rows_held": B, "static_ms": t_static,
               "engine_step_ms": t_engine}  # rows_held: every row ran through the timed steps
        if eng.runner._graphs:
            G = bucket(B)
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                eng.runner._graphs[G].replay()
            sync()
            row["paged_ms"] = (time.perf_counter() - t0) / steps * 1e3
            row["paged_over_static"] = row["paged_ms"] / t_static
        row["engine_over_static"] = t_engine / t_static
        rows.append(row)
        print(row, flush=True)
        del eng
        _free()
    return rows


def offline_row(name: str, model, lean, reqs, a, deadline: float = math.inf) -> dict:
    """One offline contestant's row. transformers' runs stop at ``--peer-cap-s`` or 45 s before
    ``deadline``, whichever comes first (a bound on their throughput then, never a lost call)."""
    if name == "ours":
        return serve_peers.ours(lean, reqs, max_seqs=a.max_seqs, max_step_tokens=a.max_step_tokens)
    if name == "static":
        return serve_peers.static(lean, reqs, batch=a.static_batch)
    from dispatch.engine import use_dispatch_experts

    default = model.config._experts_implementation
    if name == "hf_cb_dispatch":
        use_dispatch_experts(model)
    try:
        cap = max(30.0, min(a.peer_cap_s, deadline - time.perf_counter() - 45))
        with serve_online.peer_attention():
            return serve_peers.hf_cb(model, reqs, warmup=runtime.HAS_CUDA, timeout_s=cap,
                                     cache_tokens=cpu_cache_tokens(model, a))
    finally:
        model.set_experts_implementation(default)


def cpu_cache_tokens(model, a) -> int | None:
    """On a CPU, transformers' KV cache gets ours' size there (every running sequence at the full context):
    left to itself it takes most of the host's RAM (14 GB of a 24 GiB machine for the shipped model). On a
    GPU, None: each engine sizes its cache from free memory, as a user gets it."""
    if runtime.HAS_CUDA:
        return None
    return a.max_seqs * getattr(model.config, "max_position_embeddings", 2048)


def save_folder(model, tok) -> str:
    """The model and its tokenizer in a temporary folder (for the servers' processes)."""
    folder = tempfile.mkdtemp(prefix="dispatch-serve-")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def kept(parts: list[str], out: str | None) -> dict:
    """The workload descriptions of the parts this run does not measure, from the recording it adds
    to: the file at ``out``, else this GPU's recording shipped with the package, which is copied
    there first (so the run's saves merge into it: :func:`record`)."""
    path = pathlib.Path(out or results.SCRATCH) / bench.gpu_slug() / "serve.json"
    doc = json.loads(path.read_text()) if path.is_file() else results.load("serve", bench.gpu_slug())
    if doc is None:
        return {}
    if not path.is_file():
        files.write_text(path, json.dumps(doc, indent=1) + "\n")
    return {k: doc[k] for k in ("offline", "online", "model", "dtype") if k in doc and k not in parts}


def record(rows: list[dict], extra: dict) -> None:
    """Save this run's rows, merged into the recording there (its rows of the other parts kept, each
    run's commit in ``"parts"``: :func:`dispatch_book.bench.results.merged`); a recording that cannot
    take them (other software, another GPU) is replaced, and says so."""
    row = rows[-1]
    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k != "errors"}, flush=True)
    try:
        bench.save("serve", rows, extra=extra, merge=True)
    except results.CannotMerge as e:
        print(f"replacing the recording there: {e}", flush=True)
        bench.save("serve", rows, extra=extra)


def _blocks_used(url: str) -> int:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return int(re.search(r"^dispatch_kv_blocks_used (\d+)$", text, re.M).group(1))


def reliability_row(url: str, name: str, a, V: int, deadline: float) -> dict:
    """--reliability-n requests with disconnects and malformed ones, then each completed text against
    the same request sent alone (up to 100 of them)."""
    row = {"part": "reliability", "contestant": "ours", "requests": a.reliability_n}
    reqs = serve_load.workload(a.reliability_n, (4, 64), (4, 32), min(V, 1000), a.seed + 1)
    left, rep = max(60.0, deadline - time.perf_counter()), {}
    try:
        asyncio.run(asyncio.wait_for(serve_load.reliability(url, name, reqs, seed=a.seed, into=rep), left))
    except asyncio.TimeoutError:  # what came back that far says how far it got
        return {**row, "did_not_run": f"not done within the {left:.0f} s left of the budget",
                "statuses_so_far": rep.get("statuses"), "completed_so_far": len(rep.get("texts", ())),
                "problems": rep.get("problems", [])[:10]}
    time.sleep(1.0)
    row.update(statuses=rep["statuses"], kinds=rep["kinds"], problems=rep["problems"][:10],
               blocks_held_after=_blocks_used(url), completed=len(rep["texts"]))
    differ = []
    checked = list(rep["records"])[:100]
    for i in checked:  # each completed answer against the same request alone (margins of near ties)
        recs, _ = asyncio.run(serve_load.run_load(url, name, [reqs[i]], math.inf, ignore_eos=False, logprobs=2))
        d = serve_load.first_difference(rep["records"][i], recs[0])
        if d is not None:
            differ.append({"request": i, **d})
    row.update(checked_alone=len(checked), differ_alone=differ)
    return row


def main(argv=None) -> None:
    a = parse(argv)
    t_start = time.perf_counter()
    deadline = t_start + a.budget_s
    parts, names = a.parts.split(","), a.contestants.split(",")
    rows, extra = [], kept(parts, results._cli["out"])
    extra["slo"] = {"ttft_ms": a.slo_ttft_ms, "tpot_ms": a.slo_tpot_ms}
    extra["peer_attention"] = serve_online.PEER_ATTENTION

    def save(row):
        rows.append(row)
        record(rows, extra)

    if a.url:  # an external server: the online sweep only
        reqs = serve_load.workload(a.online_n, _range(a.online_prompt), _range(a.online_output), 1000, a.seed)
        for r in serve_online.sweep("ours", a.url, a.served_model, reqs, [float(x) for x in a.rates.split(",")],
                                    slo_ttft_s=a.slo_ttft_ms / 1e3, slo_tpot_s=a.slo_tpot_ms / 1e3):
            save({"part": "online", "contestant": "url", "url": a.url, **r})
        return
    from dispatch.engine import LeanModel, register

    register()
    model, tok, what = build_model()
    lean = LeanModel.from_hf(model)
    V, cpu_cache = model.config.vocab_size, cpu_cache_tokens(model, a)
    extra.update(model=what, dtype=str(lean.dtype))
    if "step" in parts:
        for r in step_rows(lean, [int(b) for b in a.step_batches.split(",")], a.step_context):
            save(r)
    if "offline" in parts:
        reqs = serve_load.workload(a.offline_n, _range(a.offline_prompt), _range(a.offline_output), V, a.seed)
        extra["offline"] = {"n": a.offline_n, "prompt": a.offline_prompt, "output": a.offline_output}
        for name in (n for n in OFFLINE if n in names):
            row = {"part": "offline", "contestant": name}
            if time.perf_counter() > deadline:
                row["skipped"] = f"time budget ({a.budget_s:.0f} s) spent"
            else:
                try:
                    row.update(offline_row(name, model, lean, reqs, a, deadline))
                except serve_peers.Unfinished as e:  # a bound on its throughput, never a number of its own
                    row.update(e.bound())
                except Exception as e:  # noqa: BLE001 - recorded with its reason, never a number
                    row["did_not_run"] = f"{type(e).__name__}: {str(e)[:300]}"
            _free()
            save(row)
    folder = None
    if "online" in parts or "reliability" in parts:
        folder = save_folder(model, tok) if runtime.HAS_CUDA else "cpu"
        del lean, model
        _free()
    online = serve_load.workload(a.online_n, _range(a.online_prompt), _range(a.online_output), V, a.seed)
    rates = [float(x) for x in a.rates.split(",")]
    if "online" in parts:
        extra["online"] = {"n": a.online_n, "prompt": a.online_prompt, "output": a.online_output, "rates": rates}
    servers = [n for n in ("hf_serve", "ours") if n in names and "online" in parts]
    if "reliability" in parts and "ours" not in servers:
        servers.append("ours")
    for kind in servers:
        log_path = os.path.join(tempfile.gettempdir(), f"serve-{kind}.log")
        try:
            with serve_online.server(kind, folder, max_seqs=a.max_seqs, max_step_tokens=a.max_step_tokens,
                                     cache_tokens=cpu_cache, log_path=log_path) as (url, n):
                if "online" in parts and kind in names:
                    for r in serve_online.sweep(kind, url, n, online, rates, slo_ttft_s=a.slo_ttft_ms / 1e3,
                                                slo_tpot_s=a.slo_tpot_ms / 1e3, seed=a.seed, deadline=deadline):
                        if r.get("failed"):  # what the server said went wrong, from its own log
                            r["server_error"] = serve_online.last_error(log_path)
                        save({"part": "online", "contestant": kind, **r})
                if kind == "ours" and "reliability" in parts:  # the same server, then the faults
                    save(reliability_row(url, n, a, V, deadline))
        except serve_online.DidNotRun as e:  # a server that does not start is a recorded reason
            save({"part": "online" if "online" in parts else "reliability", "contestant": kind,
                    "did_not_run": str(e)[:400]})
    print(f"done in {time.perf_counter() - t_start:.0f} s")
