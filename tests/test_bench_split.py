"""The split race's pieces that run without a GPU: its candidates and the phases it reads from a trace."""
import pytest
import torch

from dispatch.kernels.tiles import DecodeConfig
from dispatch_book.bench import split


def test_candidates_cover_every_tile_and_grid_and_keep_the_chain_tiles_otherwise():
    chain = DecodeConfig(block_i=32, block_h=256, block_ho=64, block_id=128, programs=1056)
    c = split.candidates(chain, sms=132)
    assert len(c["split"]) == len(split.TILES) * len(split.GRIDS)
    assert len(c["one_launch"]) == 2 * len(split.GRIDS)
    for cfg in c["split"].values():
        assert (cfg.split, cfg.fused, cfg.block_h, cfg.block_id) == (1, 0, 256, 128)
        assert cfg.programs % 132 == 0 and (cfg.block_i, cfg.block_ho) in split.TILES
    for cfg in c["one_launch"].values():
        assert cfg.split == 0 and cfg.fused >= 1 and (cfg.block_i, cfg.block_ho) == (32, 64)


def test_phases_from_a_hand_made_trace():
    # [sm, program, kind, start_ns, end_ns]; -1 rows never ran
    buf = torch.tensor([[0, 0, 2, 1000, 3000], [1, 1, 2, 1500, 4000], [0, 0, 3, 4200, 5000],
                        [1, 1, 3, 4500, 6000], [-1, -1, -1, -1, -1]])
    ph = split.phases([("split", buf)])
    assert ph["split_end_us"] == pytest.approx(3.0)
    assert (ph["reduce_start_us"], ph["reduce_end_us"]) == (pytest.approx(3.2), pytest.approx(5.0))
    assert ph["split_items"]["items"] == 2


def test_refuses_without_a_gpu(monkeypatch):
    monkeypatch.setattr(split.runtime, "HAS_CUDA", False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        split.main([])
