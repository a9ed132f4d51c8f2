"""The layer's inputs validated where they enter: experts stored transposed are read as such, ranks
built from different weights refuse to start, and combine never sums memory nobody wrote."""
import pytest
import torch
import torch.distributed as dist

from dispatch import MoELayer, random_weights
from dispatch.config import PRESETS
from dispatch.hf import moe_blocks, tiny_model
from dispatch.kernels import grouped_gemm as gg
from dispatch.kernels.combine import combine, combine_torch
from dispatch.kernels.sort import sort_by_expert_torch
from dispatch.kernels.tiles import GemmConfig
from dispatch.parallel import RankError, launch, parallelize

CPU_CFG = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


def test_transposed_expert_storage_is_read_as_such_when_2I_equals_H():
    """Was: gate_up stored [E, H, 2I] with 2I == H passed the shape check (output off by 1.94); its
    down then failed with a shape error that did not say why. transformers records the layout on the
    experts module (is_transposed): the bridge reads it."""
    hf_config, model = tiny_model("olmoe")  # H = 64 = 2I
    block = next(moe_blocks(model))[1]
    assert hf_config.hidden_size == 2 * hf_config.intermediate_size
    x = torch.randn(5, hf_config.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = MoELayer.from_hf(block, hf_config, path="torch")(x)
        ex = block.experts
        ex.gate_up_proj = torch.nn.Parameter(ex.gate_up_proj.transpose(1, 2).contiguous())
        ex.down_proj = torch.nn.Parameter(ex.down_proj.transpose(1, 2).contiguous())
        ex.is_transposed = True
        got = MoELayer.from_hf(block, hf_config, path="torch")(x)  # (strided weights: round-off only)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
        ex.is_concatenated = False
        with pytest.raises(ValueError, match="is_concatenated=False .gate and up interleaved"):
            MoELayer.from_hf(block, hf_config)
        ex.is_concatenated = True
        ex.intermediate_dim = 16
        with pytest.raises(ValueError, match="intermediate_dim is 16 but the config says 32"):
            MoELayer.from_hf(block, hf_config)


def rank_with_own_weights():
    """Each rank builds the layer from weights seeded by its rank (a typo in a launcher script)."""
    cfg = PRESETS["tiny"]
    parallelize(MoELayer(cfg, random_weights(cfg, seed=dist.get_rank())))


def test_ranks_with_different_weights_refuse_to_start():
    """Was: they ran and disagreed with one device by 3.4."""
    with pytest.raises(RankError, match=r"different configurations \(weights\)"):
        launch(rank_with_own_weights, 2, timeout_s=60)


def test_fingerprint_sees_one_bit_and_a_swapped_expert():
    from dispatch.parallel.launch import fingerprint

    w = random_weights(PRESETS["tiny"]).gate_up_E2IH
    flipped = w.clone()
    flipped.view(torch.int32)[3, 5, 7] ^= 1
    swapped = w[[1, 0, *range(2, w.shape[0])]]
    assert fingerprint(w) == fingerprint(w.clone())
    assert len({fingerprint(w), fingerprint(flipped), fingerprint(swapped)}) == 3


def test_combine_after_a_bad_id_sums_only_written_rows():
    """Was: combine(out, K) without ids_TK after a bad id returned unwritten memory (4.55e22): the
    public grouped_down now zeroes the rows it computes nowhere."""
    g = torch.Generator().manual_seed(3)
    T, H, I, E, K = 9, 32, 16, 4, 2  # noqa: E741
    x, w = torch.randn(T, H, generator=g), torch.rand(T, K, generator=g)
    gate_up, down = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    ids[2, 1], ids[6, 0] = E + 5, -1
    for _ in range(3):  # fresh allocations each time: garbage would differ, zeros do not
        routes = sort_by_expert_torch(ids, E, 16)
        h = gg.grouped_up_swiglu(x, routes, gate_up, config=CPU_CFG)
        out = gg.grouped_down(h, routes, down, w, config=CPU_CFG)
        assert torch.all(out[2 * K + 1] == 0) and torch.all(out[6 * K] == 0)
        assert torch.equal(combine(out, K), combine(out, K, ids_TK=ids, num_experts=E))
        twin = combine_torch(gg.grouped_down_torch(h, routes, down, w), K)
        torch.testing.assert_close(combine(out, K), twin, rtol=1e-5, atol=1e-4)
        torch.empty(1 << 20).fill_(4.55e22)  # leave garbage where the next allocation may land
