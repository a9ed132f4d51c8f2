"""python -m dispatch.generate: the torch thread count it decodes with on CPU."""
import io
from types import SimpleNamespace

import pytest
import torch

from dispatch.generate import SMALL_MODEL_PARAMS, cpu_threads, main


def model_of(params: int):
    return SimpleNamespace(parameters=lambda: iter([torch.empty(1).expand(params)]))  # no memory behind it


def test_a_small_model_decodes_on_one_thread_a_large_one_on_the_default():
    assert cpu_threads(model_of(SMALL_MODEL_PARAMS - 1)) == 1
    assert cpu_threads(model_of(SMALL_MODEL_PARAMS)) == torch.get_num_threads()
    assert cpu_threads(model_of(10), "3") == 3
    with pytest.raises(ValueError, match="positive number"):
        cpu_threads(model_of(10), "0")


def test_the_cli_says_its_threads_and_leaves_the_process_as_it_was():
    before = torch.get_num_threads()
    buf = io.StringIO()
    rep = main(["--model", "cpu", "--prompt", "def ", "--max-new-tokens", "4"], out=buf)
    assert rep["threads"] == 1 and "cpu (1 thread)" in buf.getvalue()
    assert torch.get_num_threads() == before
    rep = main(["--model", "cpu", "--prompt", "def ", "--max-new-tokens", "2", "--threads", "2"], out=io.StringIO())
    assert rep["threads"] == 2 and torch.get_num_threads() == before
    with pytest.raises(ValueError, match="--threads"):
        main(["--model", "cpu", "--prompt", "def ", "--threads", "none"], out=io.StringIO())
