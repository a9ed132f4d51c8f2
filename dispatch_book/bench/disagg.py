"""Prefill/decode disaggregation against co-location at a fixed count of two devices, measured warm,
with the model's prediction beside each measurement.

    python -m dispatch_book.bench disagg --out results          # 2 GPUs: NCCL handoff; CPU: gloo, small

Writes ``<out>/<gpu>x<devices>/disagg.json`` after every row (a run cut short keeps what it measured):

    part "curve"    the step-time curves the model reads: prefill(T) and decode(B), one engine, warm
    part "layout"   per prompt mix × rate × layout: TTFT and TPOT p50/p99 measured, the same
                    predicted by :mod:`dispatch.serve.disagg_model` from the curves (``model_*``);
                    disaggregated rows add the handoff's bytes, milliseconds and GB/s (median)

Co-located = two replicas with round-robin balancing, each replica's share replayed on device 0 in
turn (independent replicas: one device measures both). Disaggregated = prefill on device 0, decode
on device 1, the KV blocks over NCCL; with no GPU the pair runs on CPU with gloo; with one GPU the
disaggregated rows hold the model's prediction only (``did_not_run``), from the curves measured there.
Model: on a GPU OLMoE-1B-7B's config with random bf16 weights (``e2e.build``); on CPU the shipped one.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch

from dispatch import files, runtime
from dispatch.serve import EngineConfig
from dispatch.serve.disagg import DisaggConfig, Disaggregated
from dispatch.serve.disagg_model import Layout, Workload, colocated, disaggregated, predict
from dispatch.serve.model import kv_bytes_per_token
from dispatch_book.bench import disagg_live, results

GPU = dict(rates=(1, 2, 4, 8, 16, 32), short=(128, 256, 512), long=(1024, 2048, 3072), output=128, n=200,
           budget=512, prefill_budget=4096, blocks=4096, prefill=(128, 512, 1024, 2048, 4096),
           decode=(1, 8, 32, 64, 128), model="dispatch_book.bench.e2e:build")
CPU = dict(rates=(2, 4, 8, 16, 32), short=(8, 16, 24), long=(64, 96), output=8, n=8, budget=32,
           prefill_budget=128, blocks=256, prefill=(8, 32, 128), decode=(1, 4, 8), model="cpu")


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m dispatch_book.bench disagg", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", type=lambda s: tuple(float(x) for x in s.split(",")), default=None)
    ap.add_argument("--n", type=int, default=None, help="requests per (mix, rate)")
    ap.add_argument("--output", type=int, default=None, help="tokens per answer")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop starting rows after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--link-gbps", type=float, default=100.0,
                    help="with one GPU: the link the model assumes for the handoff (GB/s)")
    return ap.parse_args(argv)


def settings(a) -> dict:
    s = dict(GPU if runtime.HAS_CUDA else CPU)
    for k in ("rates", "n", "output"):
        if getattr(a, k) is not None:
            s[k] = getattr(a, k)
    return s


def build(s: dict):
    if ":" in s["model"]:
        from dispatch_book.bench.e2e import build as olmoe

        model = olmoe()
        model.config.eos_token_id = model.generation_config.eos_token_id = None
        return model
    from dispatch.train import load

    return load("cpu").model


def path(out: str | None) -> pathlib.Path:
    info = runtime.describe()
    devices = 2 if torch.cuda.device_count() >= 2 else 1 if runtime.HAS_CUDA else 2
    base = pathlib.Path(out if out is not None else results.SCRATCH)
    return base / f"{results.gpu_slug(info.get('gpu') or 'cpu')}x{devices}" / "disagg.json"


def write(file: pathlib.Path, rows: list[dict], s: dict, allow_dirty: bool) -> None:
    info = runtime.describe()
    doc = {"benchmark": "disagg", "schema": 1, "gpu": info.get("gpu") or "cpu",
           "gpu_count": torch.cuda.device_count(), "git_commit": results.checked_commit(allow_dirty),
           "versions": {k: info.get(k) for k in ("python", "torch", "triton", "transformers")},
           "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "command": results.command_line(),
           "settings": {k: v for k, v in s.items() if k != "model"}, "rows": rows}
    files.write_text(file, json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> None:
    a = parse(argv)
    s = settings(a)
    cli = results._cli
    file, t_start = path(cli["out"]), time.monotonic()
    torch.set_num_threads(1 if not runtime.HAS_CUDA else torch.get_num_threads())
    model = build(s)
    ecfg = EngineConfig(block_size=16, num_blocks=s["blocks"], max_seqs=64, max_step_tokens=s["budget"],
                        prefix_caching=False)  # every row computes its prompts: the same ones recur
    pre, dec = disagg_live.step_curves(model, prefill_tokens=s["prefill"], decode_rows=s["decode"],
                                       engine=dict(num_blocks=s["blocks"]))
    rows = [{"part": "curve", "kind": k, "tokens": list(c.tokens), "seconds": list(c.seconds)}
            for k, c in (("prefill", pre), ("decode", dec))]
    write(file, rows, s, cli["allow_dirty"])
    from dispatch.engine.model import LeanModel

    kvb = kv_bytes_per_token(LeanModel.from_hf(model))
    mixes = {"short": s["short"], "long": s["long"]}
    todo = [(m, r) for m in mixes for r in s["rates"]]
    for m, r in todo:  # co-located first, in this process
        if time.monotonic() - t_start > a.budget_s:
            break
        w = Workload(float(r), tuple(mixes[m]), s["output"], s["n"], a.seed)
        got = disagg_live.replica(model, w, ecfg)
        lay = Layout(budget=s["budget"], max_seqs=64, kv_bytes_per_token=kvb)
        rows.append({"part": "layout", "layout": "colocated", "mix": m, "prompts": list(mixes[m]), "rate": r,
                     **got, **{f"model_{k}": v for k, v in colocated(w, pre, dec, lay).items()}})
        write(file, rows, s, cli["allow_dirty"])
        print(json.dumps(rows[-1]))
    del model
    if runtime.HAS_CUDA and torch.cuda.device_count() < 2:  # one GPU: the model's rows only
        lay = Layout(budget=s["budget"], max_seqs=64, prefill_budget=s["prefill_budget"], kv_bytes_per_token=kvb,
                     link_gbps=a.link_gbps)
        for m, r in todo:
            w = Workload(float(r), tuple(mixes[m]), s["output"], s["n"], a.seed)
            rows.append({"part": "layout", "layout": "disaggregated", "mix": m, "prompts": list(mixes[m]), "rate": r,
                         "did_not_run": "needs two GPUs", "link_gbps_assumed": a.link_gbps,
                         **{f"model_{k}": v for k, v in disaggregated(w, pre, dec, lay).items()}})
        write(file, rows, s, cli["allow_dirty"])
        print(f"wrote {file} (one GPU: the disaggregated rows are the model's only)")
        return
    dcfg = DisaggConfig(model=s["model"], block_size=16, num_blocks=s["blocks"], max_seqs=64,
                        max_step_tokens=s["prefill_budget"], prefix_caching=False, timeout_s=120)
    with Disaggregated(dcfg) as d:
        for m, r in todo:
            if time.monotonic() - t_start > a.budget_s:
                rows.append({"part": "skipped", "mix": m, "rate": r, "why": f"--budget-s {a.budget_s:g} spent"})
                continue
            w = Workload(float(r), tuple(mixes[m]), s["output"], s["n"], a.seed)
            got = disagg_live.disaggregated(d, w)
            lay = Layout(budget=s["budget"], max_seqs=64, prefill_budget=s["prefill_budget"], kv_bytes_per_token=kvb,
                         link_gbps=got["handoff_gbps_p50"] or 1.0)
            rows.append({"part": "layout", "layout": "disaggregated", "mix": m, "prompts": list(mixes[m]),
                         "rate": r, "backend": d.backend, **got,
                         **{f"model_{k}": v for k, v in disaggregated(w, pre, dec, lay).items()}})
            write(file, rows, s, cli["allow_dirty"])
            print(json.dumps(rows[-1]))
    print(f"wrote {file}")


def prediction(doc: dict, rates=None, mixes=None) -> list[dict]:
    """The model's rows from a recording's curves (the chapter's reading of it)."""
    from dispatch.serve.disagg_model import StepCurve

    c = {r["kind"]: StepCurve(tuple(r["tokens"]), tuple(r["seconds"])) for r in doc["rows"] if r["part"] == "curve"}
    s = doc["settings"]
    lay = Layout(budget=s["budget"], prefill_budget=s["prefill_budget"])
    return predict(c["prefill"], c["decode"], lay, rates=rates or s["rates"],
                   prompt_mixes=mixes or (s["short"], s["long"]), output=s["output"], n=s["n"])
