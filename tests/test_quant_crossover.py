"""A layer of quantized experts leaves the decode kernels for the grouped GEMM at its own scheme's
crossover (``tiles.decode_max_tokens(..., scheme)``: the table's entry for those codes, else 64)."""
import pytest
import torch

import dispatch  # noqa: F401  (first: runtime decisions)
from dispatch import quant, tables
from dispatch.config import PRESETS, random_weights
from dispatch.kernels import quant_gemv, quant_grouped, tiles
from dispatch.quant.modules import quantized_forward
from dispatch.reference import route_reference


@pytest.fixture
def table(monkeypatch):
    """A device table with a crossover of 4 for the bf16 layer, 16 for its int8-channel codes, 8 for
    its fp8-channel codes on fp8 activations (w8a8)."""
    entries = {tables.shape_key(8, 64, 32, 2, torch.float32): {"crossover": 4},
               tables.shape_key(8, 64, 32, 2, "float32+int8-channel"): {"crossover": 16, "buckets": {}},
               tables.shape_key(8, 64, 32, 2, "float32+fp8-channel+w8a8"): {"crossover": 8, "buckets": {}}}
    monkeypatch.setattr(tiles, "_slug", lambda dev: "fake")
    monkeypatch.setattr(tables, "entry", lambda slug, E, H, I, K, dtype: entries.get(  # noqa: E741
        tables.shape_key(E, H, I, K, dtype)))
    tiles._lookup.cache_clear()
    yield
    tiles._lookup.cache_clear()


def test_decode_max_tokens_reads_the_schemes_entry(table):
    cpu = torch.device("cpu")
    assert tiles.decode_max_tokens(2, 8, 64, 32, torch.float32, cpu) == 4
    assert tiles.decode_max_tokens(2, 8, 64, 32, torch.float32, cpu, "int8-channel") == 16
    assert tiles.decode_max_tokens(2, 8, 64, 32, torch.float32, cpu, "int8-group128") == tiles.DECODE_MAX_TOKENS
    assert tiles.decode_max_tokens(2, 8, 64, 32, torch.float32, cpu, "fp8-channel+w8a8") == 8


@pytest.mark.parametrize("T,path", [(1, "decode"), (16, "decode"), (17, "grouped"), (8, "decode w8a8"),
                                    (9, "grouped w8a8")])
def test_quantized_forward_takes_the_path_of_the_schemes_crossover(table, monkeypatch, T, path):
    cfg = PRESETS["tiny"]
    w = random_weights(cfg, seed=0, dtype=torch.float32)
    w8a8 = path.endswith("w8a8")
    qe = quant.quantize_experts(w.gate_up_E2IH, w.down_EHI, "fp8-channel" if w8a8 else "int8-channel")
    g = torch.Generator().manual_seed(T)
    x = torch.randn(T, cfg.H, generator=g)
    weights_TK, ids_TK = route_reference(torch.randn(T, cfg.E, generator=g), cfg)
    ran = []
    for mod, name in ((quant_gemv, "moe_decode_quant"), (quant_grouped, "moe_experts_quant")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, real=real, name=name, **kw: ran.append(name) or real(*a, **kw))
    y = quantized_forward(qe, x, ids_TK, weights_TK, w8a8=w8a8)
    assert ran == [{"decode": "moe_decode_quant", "grouped": "moe_experts_quant"}[path.split()[0]]]
    ref = quant_gemv.moe_decode_quant_torch(x, weights_TK.float(), ids_TK, qe, w8a8=w8a8)  # either path: one layer
    assert (y - ref).norm() <= 1e-4 * ref.norm()
