"""The transformers experts backend survives torch.compile: a tiny model of each family, its experts set
to "dispatch", compiles with ``fullgraph=True`` on the CPU (where the backend runs the plain-PyTorch
reference), gives eager's logits, and a shorter sequence runs without a recompile. The eager reference
loops over ``torch.unique(ids).tolist()`` (a host read of the routing that cannot be traced); under
compile it takes :func:`dispatch.reference.experts_static`, checked here against the loop."""
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dispatch.config import MoEConfig
from dispatch.engine import register
from dispatch.hf import TINY_FAMILIES, tiny_model
from dispatch.reference import experts_reference, experts_static, route_reference


@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_a_tiny_model_compiles_fullgraph_through_the_backend_without_recompiling(family):
    register()
    _, model = tiny_model(family)
    model.set_experts_implementation("dispatch")
    g = torch.Generator().manual_seed(0)
    long, short = torch.randint(0, 128, (2, 12), generator=g), torch.randint(0, 128, (2, 7), generator=g)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model.forward, fullgraph=True, dynamic=True, backend=counter)  # a break: an error
    with torch.no_grad():
        for ids in (long, short):
            torch.testing.assert_close(compiled(input_ids=ids).logits, model(input_ids=ids).logits,
                                       atol=1e-5, rtol=1e-5)
            if ids is long:
                frames = counter.frame_count
    assert frames >= 1 and counter.frame_count == frames, "the shorter sequence recompiled"


def test_the_eager_loop_is_what_cannot_be_traced(monkeypatch):
    """The test above means something: without the static form the same compile fails."""
    import dispatch.reference as reference

    register()
    _, model = tiny_model("olmoe")
    model.set_experts_implementation("dispatch")
    monkeypatch.setattr(reference.torch.compiler, "is_compiling", lambda: False)
    torch._dynamo.reset()
    compiled = torch.compile(model.forward, fullgraph=True, dynamic=True, backend="eager")
    with pytest.raises(Exception, match="(?i)data.dependent|tolist|item|unsupported|guard"):
        with torch.no_grad():
            compiled(input_ids=torch.zeros(1, 5, dtype=torch.long))
    torch._dynamo.reset()


@pytest.mark.parametrize("activation", ["silu", "gelu"])
def test_the_static_form_is_the_loop_up_to_rounding(activation):
    cfg = MoEConfig(32, 16, 8, 3, norm_topk_prob=True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(9, 32, generator=g)
    gu, dn = torch.randn(8, 32, 32, generator=g) / 6, torch.randn(8, 32, 16, generator=g) / 4
    w, ids = route_reference(torch.randn(9, 8, generator=g), cfg)
    ids[2, 1] = 8  # an id outside [0, E): adds nothing in both
    ids[5, 0] = -1
    x[7] = float("nan")  # a non-finite token: its own row only
    loop = experts_reference(x, w, ids, gu, dn, activation=activation)
    static = experts_static(x, w, ids, gu, dn, activation)
    assert static[7].isnan().all() and loop[7].isnan().all()
    keep = [t for t in range(9) if t != 7]
    torch.testing.assert_close(static[keep], loop[keep], atol=1e-6, rtol=1e-5)
