"""Routing distributions: which experts T tokens choose, for the races and the tuner.

A kernel's time depends on how the T·K routed rows spread over the E experts: a busy expert is a
long run of rows, an idle one costs nothing. Random logits spread them evenly; real routers do not.
Three distributions, named by a spec string (``parse``):

* ``uniform`` — the softmax top-K of standard-normal logits: every expert equally likely.
* ``zipf:<r>`` — expert popularity from a Zipf law, p_i ∝ i^(−s) over a fixed, seeded order of the
  experts; a token takes K distinct experts by sampling without replacement in proportion to p
  (the top K of log p plus Gumbel noise). ``r`` is what is asked for: the busiest expert's load over
  the mean load at 4096 tokens (mean of 8 seeded draws); ``zipf_exponent`` solves for s.
* ``trace`` / ``trace:<l>`` — chapter 5's trained model (E = 16, K = 2), its router's choices at
  layer l (default 0) on validation text, replayed from ``TRACE``: the first T tokens of 16384.
  The trace's 16 experts become the preset's E honestly only where one divides the other:
  - E = m·16 (OLMoE, DeepSeek: 64; Qwen3: 128): each trace expert stands for m experts of the preset,
    and a token's K choices are K/2 of the children of each of its two trace experts (all 4 of 4
    for OLMoE, 3 of 4 for DeepSeek, 4 of 8 for Qwen3, drawn with a seed). An expert's load is
    then its parent's share: the trace's skew carries over; which children a token pairs is drawn.
  - 16 = f·E (Mixtral: 8): pairs of trace experts merge (expert e → e // f); a token's K choices
    are the first K distinct merged experts in its recorded ranking (top-K of the merged scores,
    taking a merged expert's best member). Merging averages loads, so the skew shrinks.

Every draw is seeded (the generator's seed; uniform draws on its device as the races always did,
the others on the CPU and then moved, so a test here sees the GPU run's routing) and every token's
K experts are distinct. Non-uniform routing weights are a softmax over K normal draws, largest
first: a weight's value changes no kernel's time.
"""
from __future__ import annotations

import functools
import importlib.resources
import pathlib
import re
from dataclasses import dataclass

import torch

from dispatch.config import MoEConfig
from dispatch.reference import route_reference

RATIO_TOKENS = 4096  # the token count at which zipf:<r> has busiest / mean = r
SOLVE_SEEDS = tuple(range(10_000, 10_008))  # the draws the exponent is solved over (not the races' seeds)
ORDER_SEED = 0  # which experts are popular: a fixed permutation of the ranks
TRACE = pathlib.Path(str(importlib.resources.files("dispatch") / "assets" / "traces" / "tiny_olmoe_routes.safetensors"))
KINDS = ("uniform", "zipf", "trace")


@dataclass(frozen=True)
class Routing:
    """A parsed routing spec: ``kind`` uniform | zipf | trace; ``ratio`` (zipf) the busiest/mean expert
    load at 4096 tokens; ``layer`` (trace) the trained model's layer."""

    kind: str = "uniform"
    ratio: float | None = None
    layer: int = 0

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"routing kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "zipf" and not (isinstance(self.ratio, (int, float)) and self.ratio > 1):
            raise ValueError(f"zipf routing needs a busiest/mean ratio > 1 (zipf:3), got {self.ratio!r}")
        if self.kind != "zipf" and self.ratio is not None:
            raise ValueError(f"only zipf routing takes a ratio, got {self.kind} with {self.ratio!r}")
        if not isinstance(self.layer, int) or self.layer < 0 or (self.kind != "trace" and self.layer):
            raise ValueError(f"only trace routing takes a layer (an int >= 0), got {self.kind} layer {self.layer!r}")

    @property
    def name(self) -> str:
        """The canonical spec: 'uniform', 'zipf:3', 'zipf:1.5', 'trace:0' (table keys and rows use it)."""
        if self.kind == "zipf":
            return f"zipf:{self.ratio:g}"
        return f"trace:{self.layer}" if self.kind == "trace" else "uniform"


def parse(spec) -> Routing:
    """'uniform' | 'zipf:<r>' | 'trace' | 'trace:<l>' (or a Routing) → Routing; ValueError otherwise."""
    if isinstance(spec, Routing):
        return spec
    m = re.fullmatch(r"(uniform|zipf|trace)(?::([0-9]*\.?[0-9]+))?", str(spec).strip())
    if not m or (m[1] == "uniform" and m[2]) or (m[1] == "zipf" and not m[2]) or \
            (m[1] == "trace" and m[2] and not m[2].isdigit()):
        raise ValueError(f"unknown routing {spec!r}: use 'uniform', 'zipf:<busiest/mean at {RATIO_TOKENS} "
                         "tokens>' (e.g. zipf:3) or 'trace[:<layer>]'")
    if m[1] == "zipf":
        return Routing("zipf", ratio=float(m[2]))
    return Routing("trace", layer=int(m[2] or 0)) if m[1] == "trace" else Routing()


def busiest_over_mean(ids_TK: torch.Tensor, E: int) -> float:
    """The busiest expert's routed rows over the mean (T·K / E): 1.0 is perfect balance."""
    counts_E = torch.bincount(ids_TK.reshape(-1).long().cpu(), minlength=E).double()
    return (counts_E.max() * E / max(1, ids_TK.numel())).item()


def draw(routing, cfg: MoEConfig, T: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights_TK fp32, ids_TK int64) of T tokens on g's device. ``uniform``: the softmax top-K of
    randn logits drawn from ``g`` (``route_reference``, the races' routing all along); the others from a
    CPU generator seeded with ``g.initial_seed()``."""
    r = parse(routing)
    if not isinstance(T, int) or T < 0:
        raise ValueError(f"T must be an int >= 0, got {T!r}")
    if r.kind == "uniform":
        return route_reference(torch.randn(T, cfg.E, device=g.device, generator=g), cfg)
    seed = g.initial_seed()
    if r.kind == "zipf":
        ids_TK = zipf_ids(cfg.E, cfg.K, T, zipf_exponent(cfg.E, cfg.K, r.ratio), seed)
    else:
        ids_TK = trace_ids(cfg.E, cfg.K, T, r.layer, seed)
    return _weights(T, cfg.K, seed).to(g.device), ids_TK.to(g.device)


def _weights(T: int, K: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.softmax(torch.randn(T, K, generator=g), dim=-1).sort(dim=-1, descending=True).values


# ---- zipf ----

def popularity(E: int, s: float) -> torch.Tensor:
    """p_E (float64, sums to 1): Zipf's p ∝ rank^(−s), the ranks dealt to the experts in a fixed seeded order."""
    logp = -s * torch.arange(1, E + 1, dtype=torch.float64).log()
    order = torch.randperm(E, generator=torch.Generator().manual_seed(ORDER_SEED))
    return torch.softmax(logp, 0)[order.argsort()]


def _gumbel(T: int, E: int, seed: int) -> torch.Tensor:
    u = torch.rand(T, E, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return -(-u.clamp_min(1e-300).log()).log()


def _zipf_top(gumbel_TE: torch.Tensor, K: int, s: float) -> torch.Tensor:
    return torch.topk(popularity(gumbel_TE.shape[1], s).log() + gumbel_TE, K, dim=-1).indices


def zipf_ids(E: int, K: int, T: int, s: float, seed: int) -> torch.Tensor:
    """ids_TK (int64, CPU): K distinct experts per token, drawn without replacement ∝ ``popularity(E, s)``."""
    if not 1 <= K <= E:
        raise ValueError(f"need 1 <= K <= E, got K={K}, E={E}")
    return _zipf_top(_gumbel(T, E, seed), K, s)


@functools.lru_cache(maxsize=None)
def zipf_exponent(E: int, K: int, ratio: float, T: int = RATIO_TOKENS) -> float:
    """The Zipf exponent s whose draws at T tokens have busiest/mean expert load ``ratio`` (mean over
    ``SOLVE_SEEDS``): bisection on s with the same noise throughout (the ratio then moves smoothly)."""
    if not ratio < E / K:
        raise ValueError(f"busiest/mean {ratio} is out of reach for E={E}, K={K}: at most E/K = {E / K:g} "
                         "(the busiest expert in every token)")
    noise = [_gumbel(T, E, seed) for seed in SOLVE_SEEDS]

    def mean_ratio(s: float) -> float:
        return sum(busiest_over_mean(_zipf_top(n, K, s), E) for n in noise) / len(noise)

    floor = mean_ratio(0.0)
    if not ratio > floor:
        raise ValueError(f"busiest/mean {ratio} is below what uniform routing already shows at T={T} "
                         f"(E={E}, K={K}): {floor:.3f}")
    lo, f_lo, hi = 0.0, floor - ratio, 1.0
    while (f_hi := mean_ratio(hi) - ratio) < 0:
        lo, f_lo, hi = hi, f_hi, 2 * hi
        if hi > 64:
            raise ValueError(f"busiest/mean {ratio} not reached for E={E}, K={K} with an exponent <= 64")
    # Illinois regula falsi: a root in [lo, hi] to 0.05% of the ratio in ~10 evaluations (each one topk
    # over 8 draws of T·E scores), bisecting if the bracket stalls
    s, side = hi, 0
    for _ in range(60):
        s = (lo * f_hi - hi * f_lo) / (f_hi - f_lo) if f_hi != f_lo else (lo + hi) / 2
        f = mean_ratio(s) - ratio
        if abs(f) <= 5e-4 * ratio or hi - lo < 1e-9:
            break
        if f < 0:
            lo, f_lo = s, f
            f_hi, side = (f_hi / 2, -1) if side == -1 else (f_hi, -1)
        else:
            hi, f_hi = s, f
            f_lo, side = (f_lo / 2, 1) if side == 1 else (f_lo, 1)
    return s


# ---- the recorded trace ----

@functools.lru_cache(maxsize=1)
def load_trace(path: str | None = None) -> tuple[torch.Tensor, dict]:
    """(ranks_LTR uint8, metadata): each token's experts ranked by the trained router's scores, best
    first (the first K_s = 2 are its choices), per layer; metadata says how it was recorded."""
    from safetensors import safe_open

    with safe_open(str(path or TRACE), framework="pt") as f:
        return f.get_tensor("ranks_LTR"), dict(f.metadata())


def map_ranks(ranks_TR: torch.Tensor, E_s: int, K_s: int, E: int, K: int, seed: int) -> torch.Tensor:
    """ids_TK of a preset with E experts and K choices from a trace's per-token rankings over E_s
    experts whose first K_s are the choices (see the module docstring for the two rules)."""
    T, R = ranks_TR.shape
    ranks_TR = ranks_TR.long()
    if E % E_s == 0:
        m = E // E_s
        q, rem = divmod(K, K_s)
        if q + (rem > 0) > m:
            raise ValueError(f"K={K} choices do not fit in the {m} experts each of a token's {K_s} trace experts "
                             f"stands for (E={E} from {E_s})")
        g = torch.Generator().manual_seed(seed)
        order_TSM = torch.rand(T, K_s, m, generator=g).argsort(dim=-1)  # which children, per token and source
        parts = [ranks_TR[:, j:j + 1] * m + order_TSM[:, j, :q + (j < rem)] for j in range(K_s)]
        return torch.cat(parts, dim=1)
    if E_s % E == 0:
        f = E_s // E
        if f * (K - 1) + 1 > R:
            raise ValueError(f"merging {f} trace experts into one needs {f * (K - 1) + 1} ranks a token to be sure "
                             f"of K={K} distinct; the trace holds {R}")
        merged_TR = ranks_TR // f
        seen_TRR = (merged_TR[:, :, None] == merged_TR[:, None, :]).tril(diagonal=-1)
        first_TR = ~seen_TRR.any(dim=-1)  # the first occurrence of each merged expert
        pos_TK = torch.sort((~first_TR).to(torch.int8), dim=1, stable=True).indices[:, :K]
        return merged_TR.gather(1, pos_TK)
    raise ValueError(f"the trace has E={E_s} experts: it maps onto E that is a multiple or a divisor of it, "
                     f"not E={E}")


def trace_ids(E: int, K: int, T: int, layer: int = 0, seed: int = 0, path: str | None = None) -> torch.Tensor:
    """ids_TK (int64, CPU): the trace's first T tokens at ``layer``, mapped onto E experts and K choices."""
    ranks_LTR, meta = load_trace(path)
    L, n = ranks_LTR.shape[:2]
    if not 0 <= layer < L:
        raise ValueError(f"the trace has layers 0..{L - 1}, got layer {layer}")
    if T > n:
        raise ValueError(f"the trace holds {n} tokens; T={T} asks for more")
    return map_ranks(ranks_LTR[layer, :T], int(meta["E"]), int(meta["K"]), E, K, seed)


def record_trace(path=TRACE, tokens: int = 16384, ranks: int = 4, seq_len: int = 128, batch: int = 16) -> pathlib.Path:
    """Record ``TRACE``: chapter 5's trained model (``dispatch/assets/cpu``, fp32 on the CPU) on the
    validation windows chapter 5 evaluates (``data.windows`` of the stdlib's validation files), each
    token's top-``ranks`` experts per layer by the router's scores (+ the checkpoint's selection bias,
    if any), checked against the choices the model made. A few hundred KB of uint8."""
    from safetensors.torch import save_file

    from dispatch import data, routertap, train

    ck = train.load("cpu", device="cpu")
    win = data.windows(data.token_ids(ck.tokenizer, "stdlib", "val"), seq_len, tokens)
    out = []
    with torch.no_grad(), routertap.RouterTap(ck.model, bias_LE=ck.bias_LE) as tap:
        for chunk in win.split(batch):
            ck.model(input_ids=chunk[:, :-1])
            layer = []
            for i, (logits_TE, ids_TK) in enumerate(zip(tap.logits_L, tap.ids_L, strict=True)):
                score_TE = torch.softmax(logits_TE.float(), dim=-1)
                if ck.bias_LE is not None:
                    score_TE = score_TE + ck.bias_LE[i].to(score_TE)
                top_TR = torch.topk(score_TE, ranks, dim=-1).indices
                if not torch.equal(top_TR[:, :ids_TK.shape[1]], ids_TK):
                    raise AssertionError(f"layer {i}: the recorded ranking disagrees with the router's choices")
                layer.append(top_TR)
            out.append(torch.stack(layer))
    ranks_LTR = torch.cat(out, dim=1).to(torch.uint8).contiguous()
    cfg = ck.model.config
    meta = {"E": str(cfg.num_experts), "K": str(cfg.num_experts_per_tok), "layers": str(cfg.num_hidden_layers),
            "tokens": str(ranks_LTR.shape[1]), "ranks": str(ranks), "seq_len": str(seq_len),
            "corpus": f"stdlib val, manifest {data.manifest()['hash']}",
            "model_sha256": _model_hash(), "command": "python -m dispatch.tune.routing_dist --record-trace"}
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"ranks_LTR": ranks_LTR}, str(path), metadata=meta)
    load_trace.cache_clear()
    return path


def _model_hash() -> str:
    import json

    from dispatch import train

    return json.loads((train.ASSETS / "cpu" / "hashes.json").read_text())["sha256"]["model.safetensors"]


def describe(routing, cfg: MoEConfig, ids_TK: torch.Tensor) -> dict:
    """The fields a benchmark row records about its routing: name, measured busiest/mean, and for
    zipf the exponent that was solved for."""
    r = parse(routing)
    out = {"routing": r.name, "busiest_over_mean": busiest_over_mean(ids_TK, cfg.E)}
    if r.kind == "zipf":
        out["zipf_exponent"] = zipf_exponent(cfg.E, cfg.K, r.ratio)
    return out


def main(argv=None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m dispatch.tune.routing_dist", description=__doc__.split("\n")[0])
    p.add_argument("--record-trace", action="store_true", help=f"record {TRACE.name} from the trained model")
    p.add_argument("--show", default="", help="comma-separated presets: busiest/mean of each routing at 4096 tokens")
    a = p.parse_args(argv)
    if a.record_trace:
        print(f"wrote {record_trace()}")
    from dispatch.config import PRESETS

    for name in (s for s in a.show.split(",") if s):
        cfg = PRESETS[name]
        for spec in ("uniform", "zipf:1.5", "zipf:3", "trace"):
            w, ids = draw(spec, cfg, RATIO_TOKENS, torch.Generator().manual_seed(0))
            extra = f" (s = {zipf_exponent(cfg.E, cfg.K, parse(spec).ratio):.3f})" if spec.startswith("zipf") else ""
            print(f"{name:18s} {spec:9s} busiest/mean {busiest_over_mean(ids, cfg.E):.3f}{extra}")


if __name__ == "__main__":
    main()
