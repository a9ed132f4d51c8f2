"""The accuracy gates of quantized experts: layer error, perplexity, greedy-token agreement.

* :func:`layer_error`: relative error ‖y_q − y‖ / ‖y‖ of a layer's routed experts, quantized vs
  the bf16 weights, both computed in fp32 (only the format's error is counted), on random weights
  of a preset's exact H and I (scale blocks depend on them). ``experts`` samples that many experts
  of the layer (the error is a per-expert property for random weights; the sample is recorded).
* :func:`perplexity` and :func:`greedy_agreement`: a trained model vs its copy with
  quantized experts (:func:`dispatch.quant.dequantized_model`).
"""
from __future__ import annotations

import inspect
import math

import torch

from dispatch.config import MoEConfig, random_weights
from dispatch.quant.formats import quantize_experts
from dispatch.reference import experts_reference, rel_err, route_reference


def layer_error(cfg: MoEConfig, scheme: str, *, experts: int = 4, tokens: int = 64, seed: int = 0,
                device="cpu") -> dict:
    """Error of ``scheme`` on a layer of shape ``cfg`` (``experts`` of its E sampled): a dict of
    weight_rel_err, output_rel_err, bytes_ratio (quantized bytes / bf16 bytes, scales included)."""
    if experts < 1 or tokens < 1:
        raise ValueError(f"experts and tokens must be >= 1, got {experts} and {tokens}")
    E = min(cfg.num_experts, experts)
    sub = MoEConfig(cfg.hidden_size, cfg.intermediate_size, E, min(cfg.top_k, E), norm_topk_prob=cfg.norm_topk_prob)
    w = random_weights(sub, seed=seed, dtype=torch.bfloat16, device=device)
    g = torch.Generator(device=device).manual_seed(seed + 1)
    x = torch.randn(tokens, sub.H, generator=g, device=device)
    weights, ids = route_reference(torch.randn(tokens, E, generator=g, device=device), sub)
    qe = quantize_experts(w.gate_up_E2IH, w.down_EHI, scheme)
    gu, dn = w.gate_up_E2IH.float(), w.down_EHI.float()
    gu_q, dn_q = qe.dequantize(torch.float32)
    y = experts_reference(x, weights, ids, gu, dn)
    y_q = experts_reference(x, weights, ids, gu_q, dn_q)
    w_err = math.hypot((gu_q - gu).norm().item(), (dn_q - dn).norm().item()) / math.hypot(gu.norm().item(),
                                                                                          dn.norm().item())
    bf16_bytes = 2 * (gu.numel() + dn.numel())
    return {"weight_rel_err": w_err, "output_rel_err": rel_err(y_q, y), "bytes_ratio": qe.nbytes() / bf16_bytes,
            "experts_sampled": E, "tokens": tokens}


def perplexity(model, windows_NS1: torch.Tensor, *, batch_size: int = 16) -> float:
    """Validation perplexity of ``model`` on windows [N, S+1] (:func:`dispatch.routertap.evaluate`)."""
    from dispatch.routertap import evaluate

    return evaluate(model, windows_NS1, batch_size=batch_size)["ppl"]


@torch.no_grad()
def greedy(model, prompts_BS: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation [B, new_tokens] of prompts [B, S] (with the model's KV cache)."""
    dev = next(model.parameters()).device
    # transformers renamed past_key_values to cache (after 5.17): use whichever this version takes
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompts_BS.to(dev), use_cache=True)
    toks = [out.logits[:, -1].argmax(-1, keepdim=True)]
    for _ in range(new_tokens - 1):
        kv = getattr(out, name, None)
        out = model(input_ids=toks[-1], **{name: out.past_key_values if kv is None else kv}, use_cache=True)
        toks.append(out.logits[:, -1].argmax(-1, keepdim=True))
    return torch.cat(toks, dim=1).cpu()


@torch.no_grad()
def greedy_agreement(model, model_q, prompts_BS: torch.Tensor, new_tokens: int = 64, *,
                     reference: torch.Tensor | None = None) -> dict:
    """How often ``model_q`` picks ``model``'s greedy tokens.

    teacher_forced: share of the B·new_tokens positions where model_q's argmax, fed model's own
    continuation, equals model's token (no cascade after one disagreement).
    free_running: share of positions where the two free greedy continuations agree;
    identical: prompts whose whole continuation is the same.
    ``reference``: model's greedy continuation if already computed (``greedy(model, prompts_BS, n)``).
    """
    ref = greedy(model, prompts_BS, new_tokens) if reference is None else reference
    if tuple(ref.shape) != (prompts_BS.shape[0], new_tokens):
        raise ValueError(f"reference must be [B={prompts_BS.shape[0]}, {new_tokens}], got {tuple(ref.shape)}")
    dev = next(model_q.parameters()).device
    full = torch.cat([prompts_BS, ref], dim=1).to(dev)
    S = prompts_BS.shape[1]
    pred = model_q(input_ids=full[:, :-1]).logits[:, S - 1:].argmax(-1).cpu()
    free = greedy(model_q, prompts_BS, new_tokens)
    return {"teacher_forced": (pred == ref).float().mean().item(),
            "free_running": (free == ref).float().mean().item(),
            "identical": int((free == ref).all(dim=1).sum()), "prompts": prompts_BS.shape[0],
            "new_tokens": new_tokens}
