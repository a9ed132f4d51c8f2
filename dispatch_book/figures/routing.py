"""Chapter 0's figures: where tokens go (token × expert heatmap) and the roofline floors of a layer.

The drawing functions return the figure and do not show it: a notebook cell ends with
``plt.show()`` (so each figure appears exactly once, under papermill and nbval alike).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from dispatch.arithmetic import decode_step_roofline, expected_unique_experts, expert_layer_roofline
from dispatch.config import MoEConfig
from dispatch.reference import route_reference
from dispatch_book.figures import SMALL_PT, WIDTH_IN


def gates_TE(weights_TK: torch.Tensor, ids_TK: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Dense [T, E] gate matrix: the routing weight where a token chose an expert, else 0."""
    out = torch.zeros(ids_TK.shape[0], num_experts, dtype=torch.float32)
    return out.scatter_(1, ids_TK.cpu(), weights_TK.float().cpu())


def routing_heatmap(weights_TK: torch.Tensor, ids_TK: torch.Tensor, num_experts: int, *, title: str = ""):
    """Token × expert heatmap of the routing weights, with tokens per expert as bars on top.

    weights_TK, ids_TK: [T, K] as returned by ``route_reference``. Returns the figure.
    """
    g = gates_TE(weights_TK, ids_TK, num_experts).numpy()
    T, E = g.shape
    counts_E = (g > 0).sum(0) if T else np.zeros(E)
    fig, (top, ax) = plt.subplots(2, 1, figsize=(min(2 + 0.35 * E, 8.8), 1.6 + min(0.22 * T, 6)),
                                  gridspec_kw={"height_ratios": [1, 3]}, sharex=True, constrained_layout=True)
    top.bar(np.arange(E), counts_E, color="tab:blue")
    top.axhline(T * ids_TK.shape[1] / E if T else 0, color="k", lw=0.8, ls="--", label="uniform")
    top.set_ylabel("tokens")
    top.legend(loc="upper right", fontsize=SMALL_PT, frameon=False)
    im = ax.imshow(np.ma.masked_equal(g, 0), aspect="auto", cmap="viridis", vmin=0,
                   vmax=max(float(g.max()), 1e-6) if T else 1, interpolation="nearest")
    ax.set_facecolor("#f2f2f2")
    ax.set_xlabel("expert e")
    ax.set_ylabel("token t")
    ax.set_xticks(np.arange(E) if E <= 32 else np.arange(0, E, 8))
    fig.colorbar(im, ax=ax, label="routing weight", shrink=0.9)
    if title:
        top.set_title(title)
    return fig


def draw_routing(num_experts: int = 8, top_k: int = 2, temperature: float = 1.0, tokens: int = 24,
                 seed: int = 0, norm_topk_prob: bool = False, hidden: int = 32):
    """Route ``tokens`` random tokens through a random router and draw the heatmap (the widget's view).

    Lower temperature sharpens the softmax (weights go to the first choice); higher flattens it.
    """
    top_k = min(top_k, num_experts)
    cfg = MoEConfig(hidden, 1, num_experts, top_k, norm_topk_prob=norm_topk_prob)
    g = torch.Generator().manual_seed(seed)
    x_TH = torch.randn(tokens, hidden, generator=g)
    router_EH = torch.randn(num_experts, hidden, generator=g) / hidden ** 0.5
    weights_TK, ids_TK = route_reference((x_TH @ router_EH.T) / temperature, cfg)
    fig = routing_heatmap(weights_TK, ids_TK, num_experts,
                          title=f"{tokens} tokens, top-{top_k} of {num_experts} experts, temperature {temperature:g}")
    return fig


def routing_widget(seed: int = 0):
    """ipywidgets sliders (E, K, temperature, T) that redraw :func:`draw_routing` live."""
    from ipywidgets import FloatLogSlider, IntSlider, interact

    def redraw(num_experts, top_k, temperature, tokens):
        draw_routing(num_experts, top_k, temperature, tokens, seed=seed)  # ipywidgets shows the figure

    label = {"style": {"description_width": "initial"}}  # the whole name ("num_experts"), not "num_exp…"
    return interact(redraw, num_experts=IntSlider(16, 2, 64, **label), top_k=IntSlider(2, 1, 8, **label),
                    temperature=FloatLogSlider(1.0, base=10, min=-1, max=1, **label),
                    tokens=IntSlider(24, 1, 64, **label))


def roofline(fn, *args, ceil: dict, **kw):
    """Call an arithmetic roofline function (``expert_layer_roofline``, ``decode_step_roofline``),
    passing the ceilings where the function takes them; only its ``flops`` and ``bytes`` are used."""
    import inspect

    params = inspect.signature(fn).parameters
    if "hbm_bps" in params:
        kw.update(hbm_bps=ceil["hbm_copy_gbps"] * 1e9, flops_per_s=ceil["bf16_tflops"] * 1e12)
    return fn(*args, **kw)


def floors(flops: float, nbytes: float, ceil: dict) -> dict:
    """Memory and compute floors (seconds) of some work on the ceilings ``ceil`` (``hbm_copy_gbps``,
    ``bf16_tflops``, as from ``dispatch_book.checks.ceilings``)."""
    t_mem = nbytes / (ceil["hbm_copy_gbps"] * 1e9)
    t_cmp = flops / (ceil["bf16_tflops"] * 1e12)
    return {"t_memory_s": t_mem, "t_compute_s": t_cmp, "floor_s": max(t_mem, t_cmp),
            "bound": "memory" if t_mem >= t_cmp else "compute"}


def kv_bytes_per_token(shape, bytes_per_param: int = 2) -> int:
    """Bytes of KV cache one token of context adds, read once per decode step: K and V of every
    layer's KV heads (OLMoE-1B-7B, bf16: 2 · 16 layers · 16 heads · 128 · 2 B = 128 KiB)."""
    return 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * bytes_per_param


def decode_table(shape, tokens, context: int, ceil: dict, bytes_per_param: int = 2) -> list[dict]:
    """One decode step per batch size T (one new token per sequence, each with ``context`` tokens
    of KV cache): weights read, KV cache read, FLOPs, intensity and the floor on ``ceil``."""
    m, rows = shape.moe, []
    for T in tokens:
        r = roofline(decode_step_roofline, shape, T, ceil=ceil, bytes_per_param=bytes_per_param,
                     context=context)
        kv = T * context * kv_bytes_per_token(shape, bytes_per_param)
        nbytes = r.bytes + kv
        f = floors(r.flops, nbytes, ceil)
        rows.append({"T": T, "experts/layer": expected_unique_experts(m.E, m.K, T),
                     "weights GB": r.bytes / 1e9, "KV GB": kv / 1e9,
                     "MB/token": nbytes / T / 1e6, "FLOP/byte": r.flops / nbytes,
                     "floor µs": f["floor_s"] * 1e6, "tokens/s ≤": T / f["floor_s"], "bound": f["bound"]})
    return rows


def roofline_figure(cfg: MoEConfig, ceil: dict, tokens=(1, 4, 16, 64, 256, 1024, 4096, 16384), *,
                    bytes_per_param: int = 2, gpu: str | None = None):
    """Floors of the routed experts of one layer vs batch size: time per step (memory vs compute)
    and per token, on the measured ceilings ``ceil`` of ``gpu``."""
    lay = [roofline(expert_layer_roofline, cfg, t, ceil=ceil, bytes_per_param=bytes_per_param)
           for t in tokens]
    rows = [floors(r.flops, r.bytes, ceil) for r in lay]
    t_mem = np.array([r["t_memory_s"] for r in rows]) * 1e6
    t_cmp = np.array([r["t_compute_s"] for r in rows]) * 1e6
    fig, (a, b) = plt.subplots(1, 2, figsize=(WIDTH_IN, 3.6), constrained_layout=True)
    a.loglog(tokens, t_mem, "o-", label=f"memory: bytes / {ceil['hbm_copy_gbps'] / 1e3:.2f} TB/s")
    a.loglog(tokens, t_cmp, "s-", label=f"compute: FLOPs / {ceil['bf16_tflops']:.0f} TFLOP/s")
    a.set_xlabel("tokens in the batch T")
    a.set_ylabel("floor per layer step (µs)")
    a.legend(fontsize=SMALL_PT)
    b.loglog(tokens, np.maximum(t_mem, t_cmp) * 1e3 / np.array(tokens), "o-", color="tab:red")
    b.set_xlabel("tokens in the batch T")
    b.set_ylabel("floor per token (ns)")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    if gpu is None:  # the set whose ceilings the chapters read
        from dispatch_book.bench import sets

        gpu = sets.gpu_name()
    fig.suptitle(f"routed experts of one layer: H={cfg.H}, I={cfg.I}, top-{cfg.K} of {cfg.E}, "
                 f"{gpu} bf16 (measured ceilings)")
    return fig


def route_agreement(cfgs: dict, tokens: int, dev, dt, seed: int, *, exact: bool, w_tol: float) -> list[dict]:
    """Chapter 1's router check, one row per layer config: ``route`` (the kernel) against
    ``route_torch`` on seeded logits. With ``exact`` the ids must match everywhere; otherwise (bf16 or
    fp16 logits, or compiled Triton) softmax ids may differ only between experts of equal probability
    and sigmoid ids at ≤ 1 token in 1000 (the GPU tests' rule). Weights within ``w_tol`` wherever
    the ids agree."""
    from dispatch.kernels.routing import route, route_torch

    out = []
    for name, c in cfgs.items():
        g = torch.Generator().manual_seed(seed + 1)
        lg = torch.randn(tokens, c.E, generator=g).to(dev, dt)
        b = (0.3 * torch.randn(c.E, generator=g)).to(dev) if c.correction_bias else None
        w_TK, ids_TK = route(lg, c, b)
        w_ref, ids_ref = route_torch(lg, c, b)
        ok_T = (ids_TK.long() == ids_ref.long()).all(1)
        if not exact and c.scoring == "softmax":  # tied experts have equal probabilities
            p_TE = torch.softmax(lg.float(), -1)
            gap = p_TE.gather(1, ids_TK.long()) - p_TE.gather(1, ids_ref.long())
            ok_T = (gap.abs() <= 1e-6).all(1)
        ids_ok = bool(ok_T.all()) if exact or c.scoring == "softmax" else ok_T.float().mean().item() >= 0.999
        w_ok = bool((w_TK - w_ref)[ok_T].abs().max() <= w_tol) if ok_T.any() else True
        out.append({"layer": name, "E": c.E, "K": c.K, "ids agree": "yes" if ids_ok else "NO",
                    f"weights within {w_tol:.0e}": "yes" if w_ok else "NO"})
    return out
