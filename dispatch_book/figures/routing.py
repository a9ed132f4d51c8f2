"""Chapter 0's figures: where tokens go (token × expert heatmap) and the roofline floors of a layer.

The drawing functions return the figure and do not show it: a notebook cell ends with
``plt.show()`` (so each figure appears exactly once, under papermill and nbval alike).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from dispatch.arithmetic import H200_BF16_FLOPS, H200_HBM_BPS, expert_layer_roofline
from dispatch.config import MoEConfig
from dispatch.reference import route_reference


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
    fig, (top, ax) = plt.subplots(2, 1, figsize=(min(2 + 0.35 * E, 12), 1.6 + min(0.22 * T, 6)),
                                  gridspec_kw={"height_ratios": [1, 3]}, sharex=True, constrained_layout=True)
    top.bar(np.arange(E), counts_E, color="tab:blue")
    top.axhline(T * ids_TK.shape[1] / E if T else 0, color="k", lw=0.8, ls="--", label="uniform")
    top.set_ylabel("tokens")
    top.legend(loc="upper right", fontsize=8, frameon=False)
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

    return interact(redraw, num_experts=IntSlider(16, 2, 64), top_k=IntSlider(2, 1, 8),
                    temperature=FloatLogSlider(1.0, base=10, min=-1, max=1), tokens=IntSlider(24, 1, 64))


def roofline_figure(cfg: MoEConfig, tokens=(1, 4, 16, 64, 256, 1024, 4096, 16384), *, bytes_per_param: int = 2):
    """Floors of the routed experts of one layer vs batch size: time per step (memory vs compute)
    and per token, on the H200 ceilings of ``dispatch.arithmetic``."""
    rows = [expert_layer_roofline(cfg, t, bytes_per_param=bytes_per_param) for t in tokens]
    t_mem = np.array([r.t_memory_s for r in rows]) * 1e6
    t_cmp = np.array([r.t_compute_s for r in rows]) * 1e6
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6), constrained_layout=True)
    a.loglog(tokens, t_mem, "o-", label=f"memory: bytes / {H200_HBM_BPS / 1e12:.1f} TB/s")
    a.loglog(tokens, t_cmp, "s-", label=f"compute: FLOPs / {H200_BF16_FLOPS / 1e12:.0f} TFLOP/s")
    a.set_xlabel("tokens in the batch T")
    a.set_ylabel("floor per layer step (µs)")
    a.legend(fontsize=8)
    b.loglog(tokens, np.maximum(t_mem, t_cmp) * 1e3 / np.array(tokens), "o-", color="tab:red")
    b.set_xlabel("tokens in the batch T")
    b.set_ylabel("floor per token (ns)")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"routed experts of one layer: H={cfg.H}, I={cfg.I}, top-{cfg.K} of {cfg.E}, H200 bf16")
    return fig
