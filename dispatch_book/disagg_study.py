"""Chapter 10's measurements and figures: the interference of a prefill with decode rows, the step
curves of a recording, the model's predictions drawn against rate."""
from __future__ import annotations

import statistics
import time

import matplotlib.pyplot as plt

from dispatch.serve import EngineConfig, LLMEngine, RequestParams
from dispatch.serve.disagg_model import StepCurve
from dispatch_book.figures import SMALL_PT, plain_log


def interference(model, decoding: list[list[int]], long_prompt: list[int], *, budget: int, chunked: bool,
                 steps_before: int = 6, repeats: int = 3) -> dict:
    """Requests ``decoding`` decode while ``long_prompt`` arrives: each step's seconds and tokens,
    and the decoding requests' gaps between tokens (median before the arrival, worst after).
    The schedule is the same every time, so the scene is played ``repeats`` times and each time
    taken at its fastest: other work on the machine only ever adds time."""
    runs = [_interference_once(model, decoding, long_prompt, budget, chunked, steps_before) for _ in range(repeats)]
    steps = [(min(r["steps"][i][0] for r in runs), runs[0]["steps"][i][1]) for i in range(len(runs[0]["steps"]))]
    return {"decode_step_s": min(r["decode_step_s"] for r in runs), "worst_gap_s": min(r["worst_gap_s"] for r in runs),
            "ttft_s": min(r["ttft_s"] for r in runs), "steps": steps, "largest_step": max(n for _, n in steps)}


def _interference_once(model, decoding, long_prompt, budget, chunked, steps_before) -> dict:
    e = LLMEngine(model, EngineConfig(max_seqs=8, max_step_tokens=budget if chunked else 128, block_size=4,
                                      num_blocks=256, chunked_prefill=chunked, prefix_caching=False))
    e.warmup()
    for p in decoding:
        e.add_request(p, RequestParams(max_tokens=60, ignore_eos=True))
    e.step()  # their prompts
    before, steps = [], []
    for _ in range(steps_before):
        t0 = time.perf_counter()
        e.step()
        before.append(time.perf_counter() - t0)
    rid = e.add_request(long_prompt, RequestParams(max_tokens=4, ignore_eos=True))
    gaps, ttft, t_arrive = [], None, time.perf_counter()
    while ttft is None:
        t0 = time.perf_counter()
        outs = e.step()
        dt = time.perf_counter() - t0
        steps.append((dt, e.step_tokens[-1]))
        gaps.append(dt)
        if any(o.id == rid for o in outs):
            ttft = time.perf_counter() - t_arrive
    return {"decode_step_s": statistics.median(before), "worst_gap_s": max(gaps), "ttft_s": ttft, "steps": steps}


def curves_from_e2e(doc: dict) -> tuple[StepCurve, StepCurve]:
    """prefill(T) and decode(B) from chapter 6's end-to-end recording: a batch of b prompts of the
    recording's prompt length prefilled in one step (T = b·prompt), and the CUDA-graph decode step of b rows."""
    rows = sorted((r for r in doc["rows"] if r.get("contestant") == "ours" and r.get("graph_step_ms")),
                  key=lambda r: r["batch"])
    P = doc["prompt"]
    pre = StepCurve(tuple(r["batch"] * P for r in rows), tuple(r["batch"] * P / r["prefill_tok_s"] for r in rows))
    dec = StepCurve(tuple(r["batch"] for r in rows), tuple(r["graph_step_ms"] / 1e3 for r in rows))
    return pre, dec


def plot_layouts(rows: list[dict], title: str):
    """TTFT and TPOT p50 against rate, both layouts, one line style per prompt length."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    prompts = sorted({r["prompt"] for r in rows})
    for ax, metric, label in zip(axes, ("ttft_p50", "tpot_p50"), ("TTFT p50 (ms)", "TPOT p50 (ms)"), strict=True):
        for prompt, style in zip(prompts, ("-", "--", ":"), strict=False):
            for layout, color in (("colocated", "tab:blue"), ("disaggregated", "tab:orange")):
                pts = sorted((r["rate"], r[metric] * 1e3) for r in rows
                             if r["prompt"] == prompt and r["layout"] == layout)
                ax.plot(*zip(*pts, strict=True), style, color=color, marker="o", ms=3,
                        label=f"{layout}, prompt {prompt}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        plain_log(ax, [r["rate"] for r in rows])
        ax.set_xlabel("requests per second")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=SMALL_PT)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def olmoe_kv() -> dict:
    """OLMoE-1B-7B's K/V per token (its published config, bf16): layers, KV heads, head dim, bytes."""
    from dispatch.hf import hub_config

    o = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded")
    d = o.hidden_size // o.num_attention_heads
    return {"layers": o.num_hidden_layers, "kv_heads": o.num_key_value_heads, "head_dim": d,
            "bytes": o.num_hidden_layers * 2 * o.num_key_value_heads * d * 2}  # K and V, 2 bytes each
