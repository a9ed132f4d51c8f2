"""Hooks on a model's routers: record the routing, add a selection bias, enforce a capacity.

Works on transformers' OLMoE (our small trained model and OLMoE-1B-7B alike): :class:`RouterTap`
hooks each layer's router (``OlmoeSparseMoeBlock.gate``, which returns
``(logits_TE, weights_TK, ids_TK)``); :func:`evaluate` runs validation windows through it
(perplexity, dropped fraction, expert load). Shape legend: T tokens · E experts · K experts per
token · L layers · N windows · S window length.

    with RouterTap(model, capacity_factor=1.25) as tap:
        model(input_ids=x)
    tap.counts_LE, tap.dropped_fraction()
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from dispatch import balance
from dispatch.hf import moe_blocks


class RouterTap:
    """Context manager hooking every layer's router: records, biases, limits capacity.

    bias_LE: per-layer selection bias (added to the softmax scores to choose experts only).
    capacity_factor: None = dropless; else pairs over capacity get weight 0 (skip the expert).
    After a forward: ``counts_LE`` (kept pairs per expert, accumulated), ``dropped_L``,
    ``pairs_L``, ``logits_L`` / ``ids_L`` / ``keep_L`` of the last forward (per layer).
    """

    def __init__(self, model, *, bias_LE: torch.Tensor | None = None, capacity_factor: float | None = None):
        self.blocks = [block for _, block in moe_blocks(model)]
        if not self.blocks:
            raise ValueError("model has no sparse MoE blocks (dispatch.hf.moe_blocks found none)")
        L, E = len(self.blocks), self.blocks[0].gate.num_experts
        if bias_LE is not None and tuple(bias_LE.shape) != (L, E):
            raise ValueError(f"bias_LE must be [{L}, {E}], got {tuple(bias_LE.shape)}")
        self.bias_LE, self.capacity_factor, self.E = bias_LE, capacity_factor, E
        self.counts_LE = torch.zeros(L, E, dtype=torch.int64)
        self.dropped_L = [0] * L
        self.pairs_L = [0] * L
        self.logits_L, self.ids_L, self.keep_L = [None] * L, [None] * L, [None] * L
        self._handles = []

    def _hook(self, layer: int):
        def hook(gate, args, output):
            logits_TE, weights_TK, ids_TK = output
            if self.bias_LE is not None:
                probs_TE = torch.softmax(logits_TE.float(), dim=-1)
                bias_E = self.bias_LE[layer].to(probs_TE.device)
                ids_TK = torch.topk(probs_TE + bias_E, gate.top_k, dim=-1).indices
                weights_TK = probs_TE.gather(1, ids_TK)
                if gate.norm_topk_prob:
                    weights_TK = weights_TK / weights_TK.sum(-1, keepdim=True)
                weights_TK = weights_TK.to(logits_TE.dtype)
            keep_TK = balance.capacity_keep_mask(ids_TK, self.E, self.capacity_factor)
            if self.capacity_factor is not None:
                weights_TK = weights_TK * keep_TK.to(weights_TK.dtype)
            with torch.no_grad():
                self.counts_LE[layer] += balance.expert_counts(ids_TK, self.E, keep_TK)
            self.dropped_L[layer] += int((~keep_TK).sum())
            self.pairs_L[layer] += keep_TK.numel()
            self.logits_L[layer], self.ids_L[layer], self.keep_L[layer] = logits_TE, ids_TK, keep_TK
            return logits_TE, weights_TK, ids_TK
        return hook

    def __enter__(self):
        self._handles = [b.gate.register_forward_hook(self._hook(i)) for i, b in enumerate(self.blocks)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []

    def dropped_fraction(self) -> float:
        return sum(self.dropped_L) / max(1, sum(self.pairs_L))


@torch.no_grad()
def evaluate(model, windows_NS1: torch.Tensor, *, batch_size: int = 16, capacity_factor: float | None = None,
             bias_LE: torch.Tensor | None = None, keep_routes: bool = False) -> dict:
    """Perplexity, dropped fraction and expert load over validation windows [N, S+1].

    ``keep_routes``: also return ``tokens_T`` and per-layer ``ids_LTK`` for specialisation.
    """
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    nll, n, tokens, ids = 0.0, 0, [], []
    with RouterTap(model, bias_LE=bias_LE, capacity_factor=capacity_factor) as tap:
        for chunk in windows_NS1.split(batch_size):
            chunk = chunk.to(dev)
            logits = model(input_ids=chunk[:, :-1]).logits.float()
            nll += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum").item()
            n += chunk[:, 1:].numel()
            if keep_routes:
                tokens.append(chunk[:, :-1].reshape(-1).cpu())
                ids.append(torch.stack([i.cpu() for i in tap.ids_L]))
    model.train(was_training)
    out = {"ppl": math.exp(nll / n), "tokens": n, "dropped": tap.dropped_fraction(), "counts_LE": tap.counts_LE}
    if keep_routes:
        out["tokens_T"], out["ids_LTK"] = torch.cat(tokens), torch.cat(ids, dim=1)
    return out
