"""Every message names the real cause and what was expected. One test per misleading message found by
trying the CLIs and the public functions with bad input (the rest sit with their surface: checkpoint
folders in test_checkpoint, quantized files in test_quant_io, generate in test_generate, the tuner in
test_tuner, the builder in test_builder). "Was:" quotes the message before."""
import re

import numpy as np
import pytest
import torch

from dispatch import PRESETS, MoELayer, data, moe, random_weights, runtime, train
from dispatch.config import MoEWeights
from dispatch.engine import Engine, SamplingParams
from dispatch.hf import moe_blocks, tiny_model
from dispatch.parallel import Placement

TINY = PRESETS["tiny"]
W = random_weights(TINY)
X = torch.randn(3, TINY.H, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("path", ["triton", "decode"])
def test_fp64_into_a_kernel_path_names_the_path_and_the_dtype(path):
    """Was: 'logits must be float32, float16 or bfloat16, got torch.float64' (x was never called logits)."""
    with pytest.raises(ValueError, match=rf"path='{path}' computes in float32, float16 or bfloat16 .*got "
                                         r"torch.float64.*path='torch'"):
        moe(X.double(), TINY, W.to(torch.float64), path=path)


def test_a_numpy_weight_is_named_as_numpy():
    """Was: "MoEWeights tensors must be on one device, got {'cpu', device(type='cpu')}"."""
    w = MoEWeights(router_EH=W.router_EH.numpy(), gate_up_E2IH=W.gate_up_E2IH, down_EHI=W.down_EHI)
    with pytest.raises(ValueError, match=r"MoEWeights.router_EH must be a torch.Tensor, got numpy.ndarray"):
        moe(X, TINY, w)


def test_a_numpy_input_is_named_as_numpy():
    """Was: 'x must be a tensor [T, H] or [B, S, H], got (3, 64)' (a shape that looked right)."""
    with pytest.raises(ValueError, match=r"x must be a torch.Tensor .*got numpy.ndarray"):
        moe(X.numpy(), TINY, W)
    assert isinstance(X.numpy(), np.ndarray)


def test_a_batched_input_of_the_wrong_width_is_named_in_its_own_shape():
    """Was: 'x must have shape [T, H=64], got (6, 65)' for an input of shape (2, 3, 65)."""
    with pytest.raises(ValueError, match=re.escape("got (2, 3, 65)")):
        MoELayer(TINY, W)(torch.randn(2, 3, 65))


def test_from_hf_with_a_dict_or_our_config_says_what_it_takes():
    """Was: "model_type must be one of (...), got None" for {'model_type': 'olmoe'} and for a MoEConfig."""
    _, model = tiny_model("olmoe")
    block = next(moe_blocks(model))[1]
    with pytest.raises(ValueError, match="the olmoe config has no 'hidden_size'"):
        MoELayer.from_hf(block, {"model_type": "olmoe"})
    with pytest.raises(ValueError, match=r"got a dispatch.MoEConfig: .*MoELayer\(cfg, weights_from_hf"):
        MoELayer.from_hf(block, TINY)
    layer = MoELayer.from_hf(block, model.config.to_dict())  # a whole config.json dict works
    assert layer.cfg.H == model.config.hidden_size


def test_random_weights_of_a_name():
    """Was: AttributeError: 'str' object has no attribute 'hidden_size'."""
    with pytest.raises(ValueError, match=r"cfg must be a dispatch.MoEConfig \(e.g. PRESETS\['tiny'\]\), got str"):
        random_weights("tiny")


def test_placement_over_zero_ranks():
    """Was: ZeroDivisionError."""
    with pytest.raises(ValueError, match="positive int num_ranks, got 0"):
        Placement.contiguous(8, 0)


def test_sampling_params_of_the_wrong_type():
    """Was: TypeError: '>=' not supported between instances of 'str' and 'float'."""
    with pytest.raises(ValueError, match="SamplingParams.temperature must be a number, got 'hot'"):
        SamplingParams("hot")


def test_engine_of_zero_rows():
    """Was: accepted; its first call then said 'need 1..1 prompts (max_batch)'."""
    with pytest.raises(ValueError, match=r"max_batch must be an int in 1..256 .*got 0"):
        Engine(object(), max_batch=0)  # checked before the model is looked at


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x"], ids=["tpu", "graphics", "cuda-index"])  # (an id
# "gpu" would mark the test GPU-only: conftest skips those on CPU)
def test_unknown_device_names(name):
    """Was: torch's 'Expected one of cpu, cuda, ipu, xpu, mkldnn, opengl, ... device type at start of
    device string: tpu' (twenty device types this package does not run on)."""
    with pytest.raises(ValueError, match=rf"device must be 'auto', 'cpu' or 'cuda\[:i\]', got '{name}'"):
        runtime.device(name)


def test_a_corpus_folder_that_does_not_exist():
    """Was: 'no *.py files under /nonexistent: is this a Python install with its sources?'."""
    with pytest.raises(FileNotFoundError, match="no folder at /nonexistent/corpus"):
        data.manifest("/nonexistent/corpus")


@pytest.mark.parametrize("argv, says", [
    (["--threads", "0"], "TrainConfig.threads must be a positive int, got 0"),  # was: torch's RuntimeError
    (["--steps", "0"], "TrainConfig.steps must be a positive int, got 0"),  # was: a ValueError traceback
    (["--aux-coef", "inf"], "TrainConfig.aux_coef must be a finite number"),
])
def test_train_flags_name_themselves(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--preset", "micro", *argv])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_generate_on_an_unknown_device(capsys):
    """Was: torch's RuntimeError traceback naming twenty device types."""
    from dispatch import generate

    with pytest.raises(SystemExit, match="device must be 'auto', 'cpu' or 'cuda"):
        generate.main(["--prompt", "x", "--device", "tpu"])


@pytest.mark.parametrize("suite, argv, says", [
    ("routing", ["--tokens", "abc"], "argument --tokens: expected comma-separated positive integers"),  # was: int()
    ("routing", ["--tokens", "8,0"], "argument --tokens: expected positive integers, got 0"),
    ("routing", ["--shapes", "olmoe"], "argument --shapes: unknown preset 'olmoe'; choose from"),
    ("parallel", ["--preset", "nosuch"], "argument --preset: invalid choice: 'nosuch'"),  # was: [rank0]: KeyError
    ("e2e", ["--contestants", "ours,theirs"], "unknown contestant 'theirs'"),
    ("kernels", ["--shapes", "mixtral"], "argument --shapes: unknown preset 'mixtral'"),
])
def test_bench_flags_name_themselves(suite, argv, says, capsys):
    from dispatch_book.bench import core

    with pytest.raises(SystemExit) as e:
        core.main([suite, *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and says in err, err
    assert f"python -m dispatch_book.bench {suite}" in err  # the command, not "__main__.py"
