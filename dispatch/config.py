"""What one MoE layer is: a frozen config (:class:`MoEConfig`) and its weights (:class:`MoEWeights`).

Shape legend (used everywhere): T tokens · H hidden · I expert intermediate · E experts ·
K experts per token · N = T·K routed rows · P padded sorted rows · R ranks.

Model families (``MoEConfig.family`` only names the preset; the fields decide the math):
    olmoe      softmax over all E, top-K, no renormalisation
    mixtral    softmax, top-K, renormalised (``norm_topk_prob``; Qwen-MoE does the same)
    qwen2_moe  as mixtral/Qwen + a shared expert behind a sigmoid gate
    deepseek_v3  sigmoid scores, a correction bias used only to *choose* experts, group-limited
               top-K (``n_group`` groups, keep ``topk_group``), renormalisation, then
               ``routed_scaling_factor``; plus shared experts (no gate)
``scoring`` names the routing family (:mod:`dispatch.families`: the table of them, each with its
reference, its kernel mode, the fast paths that apply and its transformers model types).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

import torch

from dispatch import activations, families


@dataclass(frozen=True)
class MoEConfig:
    hidden_size: int  # H
    intermediate_size: int  # I, per routed expert
    num_experts: int  # E
    top_k: int  # K
    scoring: str = "softmax"  # a routing family of dispatch.families
    norm_topk_prob: bool = False
    n_group: int = 1  # DeepSeek-V3 group-limited routing: E experts in n_group groups ...
    topk_group: int = 1  # ... of which the best topk_group groups may be chosen from
    routed_scaling_factor: float = 1.0
    correction_bias: bool = False  # DeepSeek-V3 e_score_correction_bias (selection only)
    shared_intermediate_size: int = 0  # I of the (fused) shared expert MLP; 0 = none
    shared_gate: bool = False  # Qwen2-MoE: sigmoid(x @ w_gate) scales the shared expert
    family: str = "custom"
    activation: str = "silu"  # the experts' gated activation (dispatch.activations): silu = SwiGLU

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_experts", "top_k", "n_group", "topk_group"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive int, got {v!r}")
        for name in ("norm_topk_prob", "correction_bias", "shared_gate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"MoEConfig.{name} must be a bool, got {getattr(self, name)!r}")
        s = self.shared_intermediate_size
        if not isinstance(s, int) or isinstance(s, bool):
            raise ValueError(f"MoEConfig.shared_intermediate_size must be an int >= 0, got {s!r}")
        f = self.routed_scaling_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or f <= 0:
            raise ValueError(f"MoEConfig.routed_scaling_factor must be a finite number > 0, got {f!r}")
        if not isinstance(self.family, str) or not self.family:
            raise ValueError(f"MoEConfig.family must be a non-empty string, got {self.family!r}")
        activations.get(self.activation)  # an unknown activation: a ValueError naming the known ones
        family = families.get(self.scoring)  # an unknown scoring: a ValueError naming the families
        if self.correction_bias and not family.correction_bias:
            have = [f.name for f in families.FAMILIES.values() if f.correction_bias]
            need = f"scoring={have[0]!r}" if len(have) == 1 else f"scoring in {have}"
            raise ValueError(f"MoEConfig.correction_bias (a selection bias) is not read by scoring={self.scoring!r}: "
                             f"it needs {need}")
        if self.n_group > 1 and not family.groups:
            raise ValueError(f"MoEConfig.n_group={self.n_group} (group-limited selection) is not read by "
                             f"scoring={self.scoring!r}; families with groups: "
                             f"{[f.name for f in families.FAMILIES.values() if f.groups]}")
        if self.top_k > self.num_experts:
            raise ValueError(f"MoEConfig.top_k={self.top_k} must be <= num_experts={self.num_experts}")
        if self.num_experts % self.n_group:
            raise ValueError(f"num_experts={self.num_experts} must divide into n_group={self.n_group} groups")
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be <= n_group={self.n_group}")
        if self.n_group > 1 and self.top_k > self.topk_group * (self.num_experts // self.n_group):
            raise ValueError("top_k is larger than the experts in the topk_group groups that may be chosen")
        if self.shared_intermediate_size < 0:
            raise ValueError("shared_intermediate_size must be >= 0")
        if self.shared_gate and not self.shared_intermediate_size:
            raise ValueError("shared_gate needs a shared expert (shared_intermediate_size > 0)")

    # Short names matching the shape legend.
    @property
    def H(self) -> int:
        return self.hidden_size

    @property
    def I(self) -> int:  # noqa: E743
        return self.intermediate_size

    @property
    def E(self) -> int:
        return self.num_experts

    @property
    def K(self) -> int:
        return self.top_k

    def replace(self, **kw) -> "MoEConfig":
        return replace(self, **kw)

    def expert_flops_per_token(self) -> int:
        """Multiply-adds x2 of the K routed experts (gate/up and down), shared expert included."""
        routed = self.top_k * 2 * (3 * self.hidden_size * self.intermediate_size)
        shared = 2 * 3 * self.hidden_size * self.shared_intermediate_size
        return routed + shared


# Shapes of the layers the book benchmarks (published configs; no weights are needed).
PRESETS: dict[str, MoEConfig] = {
    "olmoe-1b-7b": MoEConfig(2048, 1024, 64, 8, family="olmoe"),
    "mixtral-8x7b": MoEConfig(4096, 14336, 8, 2, norm_topk_prob=True, family="mixtral"),
    "deepseek-moe-16b": MoEConfig(2048, 1408, 64, 6, shared_intermediate_size=2 * 1408, family="deepseek_moe"),
    "qwen3-30b-a3b": MoEConfig(2048, 768, 128, 8, norm_topk_prob=True, family="qwen3_moe"),
    "qwen2-57b-a14b": MoEConfig(3584, 2560, 64, 8, shared_intermediate_size=20480, shared_gate=True,
                                family="qwen2_moe"),
    "deepseek-v3": MoEConfig(7168, 2048, 256, 8, scoring="sigmoid", norm_topk_prob=True, n_group=8, topk_group=4,
                             routed_scaling_factor=2.5, correction_bias=True, shared_intermediate_size=2048,
                             family="deepseek_v3"),
    # The embedded default: small enough for Triton's interpreter on 2 CPU cores.
    "tiny": MoEConfig(64, 32, 8, 2, family="olmoe"),
}


def _kind(obj) -> str:
    """``numpy.ndarray``, ``list``: what a value is, for messages."""
    t = type(obj)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"


@dataclass
class MoEWeights:
    """The tensors of one layer, in transformers 5's fused layout.

    router_EH          router weight (logits = x_TH @ router_EH.T)
    gate_up_E2IH       experts' gate (rows 0..I-1) and up (rows I..2I-1) projections
    down_EHI           experts' down projection
    bias_E             DeepSeek-V3 selection bias, or None
    shared_gate_up_2SH, shared_down_HS   shared expert MLP (S = shared_intermediate_size), or None
    shared_gate_1H     Qwen2-MoE shared-expert gate, or None
    """

    router_EH: torch.Tensor
    gate_up_E2IH: torch.Tensor
    down_EHI: torch.Tensor
    bias_E: torch.Tensor | None = None
    shared_gate_up_2SH: torch.Tensor | None = None
    shared_down_HS: torch.Tensor | None = None
    shared_gate_1H: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def to(self, *args, **kw) -> "MoEWeights":
        return MoEWeights(**{k: v.to(*args, **kw) for k, v in self.tensors().items()})

    def validate(self, cfg: MoEConfig) -> None:
        """Raise ValueError unless every tensor has the shape ``cfg`` asks for, on one device."""
        H, I, E, S = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.shared_intermediate_size
        want = {"router_EH": (E, H), "gate_up_E2IH": (E, 2 * I, H), "down_EHI": (E, H, I)}
        if cfg.correction_bias:
            want["bias_E"] = (E,)
        if S:
            want["shared_gate_up_2SH"] = (2 * S, H)
            want["shared_down_HS"] = (H, S)
        if cfg.shared_gate:
            want["shared_gate_1H"] = (1, H)
        have = self.tensors()
        for name, t in have.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"MoEWeights.{name} must be a torch.Tensor, got {_kind(t)} "
                                 "(torch.as_tensor converts a numpy array)")
        for name, shape in want.items():
            if name not in have:
                raise ValueError(f"MoEWeights.{name} of shape {shape} is required by this config, got None")
            if tuple(have[name].shape) != shape:
                raise ValueError(f"MoEWeights.{name} must have shape {shape}, got {tuple(have[name].shape)}")
        extra = set(have) - set(want)
        if extra:
            raise ValueError(f"MoEWeights has tensors this config does not use: {sorted(extra)}")
        devices = {t.device for t in have.values()}
        if len(devices) > 1:
            raise ValueError(f"MoEWeights tensors must be on one device, got {devices}")
        dtypes = {t.dtype for n, t in have.items() if n != "bias_E"}
        if len(dtypes) > 1 or not next(iter(dtypes)).is_floating_point:
            raise ValueError(f"MoEWeights tensors must share one floating dtype, got {dtypes}")


def random_weights(cfg: MoEConfig, *, seed: int = 0, dtype=torch.float32, device="cpu",
                   scale: float = 1.0) -> MoEWeights:
    """Seeded random weights with a sensible scale (std ~ 1/sqrt(fan_in)); for tests and benchmarks.

    Drawn by ``device``'s own generator (a GPU draws Mixtral's gigabytes without the host); the
    same seed gives the same weights on every CPU, and on every GPU of one torch version.
    """
    if not isinstance(cfg, MoEConfig):
        raise ValueError(f"cfg must be a dispatch.MoEConfig (e.g. PRESETS['tiny']), got {type(cfg).__name__}")
    g = torch.Generator(device=device).manual_seed(seed)
    H, I, E, S = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts, cfg.shared_intermediate_size

    def rnd(*shape, fan_in):
        draw = torch.randn(*shape, generator=g, device=device, dtype=torch.float32)
        return (draw * (scale / fan_in ** 0.5)).to(dtype=dtype)

    w = MoEWeights(router_EH=rnd(E, H, fan_in=H), gate_up_E2IH=rnd(E, 2 * I, H, fan_in=H),
                   down_EHI=rnd(E, H, I, fan_in=I))
    if cfg.correction_bias:
        w.bias_E = torch.randn(E, generator=g, device=device, dtype=torch.float32) * 0.1
    if S:
        w.shared_gate_up_2SH = rnd(2 * S, H, fan_in=H)
        w.shared_down_HS = rnd(H, S, fan_in=S)
    if cfg.shared_gate:
        w.shared_gate_1H = rnd(1, H, fan_in=H)
    return w
