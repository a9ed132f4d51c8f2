"""transformers' own forward as the engine's model: for families the lean forward does not cover.

DeepSeek-V3's multi-head latent attention (MLA) is not written in :mod:`dispatch.engine.model`. Its
decode step still goes through the engine — static cache, one CUDA graph per batch bucket — by
driving transformers' modules (``experts_implementation="dispatch"`` for the routed experts) over
fixed buffers, with nothing in the step that the host must compute:

* a ``StaticCache`` per bucket: its K/V tensors never move, and each layer's write position is a
  device tensor that the step advances in place (transformers 5.24; where the forward still takes
  ``cache_position``, a fixed one-element buffer is passed instead);
* ``position_ids`` = each row's own position (the engine's ``pos_B``), for the rotary embedding;
* a 4-D additive attention mask [B, 1, 1, S_cache], computed on the device from two counters
  (prefill length, current write slot), which transformers uses as it is.

Rows of a ragged batch are right-padded in prefill: row b's prompt sits in slots 0..len_b-1, the
padding after it is masked, and every decode step writes all rows into one shared slot. Row b
then attends to its prompt and to its own decoded tokens, as ``generate`` on it alone would.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class HFConfig:
    family: str
    sliding_window: int | None = None


class HFModel(torch.nn.Module):
    """``forward(ids_BS, pos_BS, cache, *, prefill)`` → logits [B, S, V], like :class:`LeanModel`."""

    def __init__(self, model):
        super().__init__()
        from dispatch.engine.backend import use_dispatch_experts

        if getattr(model.config, "model_type", None) != "deepseek_v3":
            raise ValueError(f"HFModel drives DeepSeek-V3 (the lean forward covers the others), got "
                             f"{getattr(model.config, 'model_type', None)!r}")
        self.hf = model
        experts = [getattr(layer.mlp, "experts", None) for layer in model.model.layers]
        if any(hasattr(e, "gate_up_proj") for e in experts):  # not swapped for quantized experts
            use_dispatch_experts(model)
        for layer in model.model.layers:  # MLA expands K and V to every query head: no grouping left.
            # (transformers sets num_heads // num_key_value_heads, which a masked decode step would apply)
            layer.self_attn.num_key_value_groups = 1
        self.cfg = HFConfig("deepseek_v3")
        params = inspect.signature(model.forward).parameters
        self._takes_cache_position = "cache_position" in params
        self._cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed after 5.17
        z = dict(device=self.device, dtype=torch.long)
        self.prompt_len, self.slot = torch.zeros((), **z), torch.zeros((), **z)

    @property
    def dtype(self) -> torch.dtype:
        return self.hf.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.hf.model.embed_tokens.weight.device

    def new_cache(self, batch: int, seq: int) -> dict:
        """Static caches, one per bucket (made on first use, reused after): {"seq": seq, B: cache}."""
        return {"seq": seq}

    def _cache(self, holder: dict, B: int):
        if B not in holder:
            from transformers import StaticCache

            holder[B] = StaticCache(config=self.hf.config, max_cache_len=holder["seq"])
        return holder[B]

    def forward(self, ids_BS: torch.Tensor, pos_BS: torch.Tensor, cache: dict, *, prefill: bool) -> torch.Tensor:
        B, S = ids_BS.shape
        kv = self._cache(cache, B)
        kw = {"input_ids": ids_BS, "position_ids": pos_BS, self._cache_arg: kv, "use_cache": True}
        if prefill:  # causal over the right-padded prompts; the padding is masked from then on
            kv.reset()
            self.prompt_len.fill_(S)
            self.slot.fill_(S)
            if self._takes_cache_position:
                kw["cache_position"] = torch.arange(S, device=ids_BS.device)
            return self.hf(**kw).logits
        keys = torch.arange(cache["seq"], device=ids_BS.device)
        prompt_B1 = pos_BS - (self.slot - self.prompt_len)  # each row's prompt length
        seen = (keys < prompt_B1) | ((keys >= self.prompt_len) & (keys <= self.slot))
        mask = torch.zeros(seen.shape, dtype=self.dtype, device=ids_BS.device)
        kw["attention_mask"] = mask.masked_fill(~seen, torch.finfo(self.dtype).min)[:, None, None, :]
        if self._takes_cache_position:
            kw["cache_position"] = self.slot.view(1)
        logits = self.hf(**kw).logits
        self.slot.add_(1)
        return logits
