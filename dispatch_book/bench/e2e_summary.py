"""Chapter 6's prose numbers, read from its two H200 recordings (``e2e`` and ``e2e_profile``) and
OLMoE-1B-7B's published config (the one the benchmark builds), formatted as the text quotes them
(glued into the page)."""
from __future__ import annotations


def step_numbers(doc: dict, pdoc: dict) -> dict[str, str]:
    """name → formatted value: the batch-1 step's bytes and read time, the profile's kinds of GPU
    time per step (µs in ``pdoc``), and the share of the roofline at batch 1 and 64."""
    from dispatch.hf import hub_config

    oc = hub_config("allenai/OLMoE-1B-7B-0924", source="embedded")
    ours = {r["batch"]: r for r in doc["rows"] if r["contestant"] == "ours"}
    prof = {(r["batch"], r["what"]): r for r in pdoc["rows"]}
    eager, graph, unfused = (prof[1, w] for w in ("ours, eager step", "ours, CUDA graph",
                                                  "ours, CUDA graph, glue as torch ops"))
    g64, gbps, K, E = prof[64, "ours, CUDA graph"], doc["read_gbps"], oc.num_experts_per_tok, oc.num_experts
    expert_mb = K * 3 * oc.hidden_size * oc.intermediate_size * 2 / 1e6  # K experts' bf16 weights

    def ms(us: float) -> str:
        return f"{us / 1e3:.2f} ms"

    return {
        "b1_gb": f"{ours[1]['bytes_per_step'] / 1e9:.1f} GB",
        "b1_read_ms": ms(ours[1]["bytes_per_step"] / gbps / 1e3),
        "read_tbs": f"{gbps / 1e3:.2f} TB/s",
        "kernels": f"{graph['kernels per step']:.0f}",
        "hf_kernels": f"{prof[1, 'transformers step (dispatch experts), eager']['kernels per step']:.0f}",
        "eager_ms": ms(eager["step"]),
        "work_ms": ms(eager["step"] - eager["launch gaps"]),
        "unfused_glue_ms": ms(unfused["norms, rope, elementwise"]),
        "unfused_kernels": f"{unfused['kernels per step']:.0f}",
        "glue_ms": ms(graph["norms, rope, elementwise"]),
        "experts_ms": ms(graph["experts"]),
        "layer_us": f"{graph['experts'] / oc.num_hidden_layers:.0f} µs",
        "floor_us": f"{expert_mb * 1e3 / gbps:.0f} µs",
        "expert_mb": f"{expert_mb:.0f} MB",
        "proj_ms": ms(graph["projections (GEMV/GEMM)"]),
        "sdpa_ms": ms(graph["attention"]),
        "b64_experts_ms": ms(g64["experts"]),
        "b64_step_ms": ms(g64["step"]),
        "b64_touched": f"{E * (1 - (1 - K / E) ** 64):.1f}",  # expected distinct experts of 64 tokens
        "E": str(E),
        "b64_gb": f"{ours[64]['bytes_per_step'] / 1e9:.0f} GB",
        "b64_pct": f"{ours[64]['pct_roofline']:.0f}%",
        "b1_pct": f"{ours[1]['pct_roofline']:.0f}%",
    }
