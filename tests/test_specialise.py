"""A kernel's source specialised to a chapter (``show_source(fn, specialise=...)``).

On small functions written here: each rule (branches dropped, ``elif`` renamed, a body moved left,
helpers inlined or dropped, readers-less assignments dropped) and what it must leave alone. On the
package's kernels: every specialised listing is valid Python, the grouped GEMM's tiles keep their
``tl.dot`` and store, and the specialised tiles, compiled in place of the shipped ones, give the
same bits under the interpreter.
"""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch

from dispatch.kernels import gemv, gemv_kernels, grouped_kernels
from dispatch_book import specialise as sp
from dispatch_book.checks import show_source

OFF = dict(QUANT=False, W8A8=False, LATE_SCALE=False, WFIRST=False, TMA=False, PDL=False, TRACE=False, NS=0)


def body(fn, **switches) -> str:
    """The specialised lines after the ``def`` line, dedented."""
    lines = sp.specialise(fn, switches).lines
    return textwrap.dedent("\n".join(lines[1:]))


# --- small functions, one rule each ---------------------------------------------------------------

def load(*a, **k):
    return 0


def wait():
    pass


def tma(x):
    return x


def _helper_scale(s_ptr, QUANT):
    s = 1.0
    if QUANT:
        s = load(s_ptr)
    return s


def _helper_wait(PDL):
    """Nothing to do unless PDL."""
    if PDL:
        wait()


def _helper_twice(v, QUANT):
    if QUANT:
        v = v * 2
    return v + v


def _kernel(x, s_ptr, EVEN, QUANT, TMA, PDL):
    _helper_wait(PDL)
    s_e = s_ptr + 1  # this expert's scales (QUANT only)
    sc = _helper_scale(s_e, QUANT)
    unused_before = 3  # noqa: F841
    if TMA:  # by descriptor
        a = tma(x)
    elif EVEN:
        a = load(x)
    else:
        a = load(x, mask=True)
    if QUANT:
        y = a * sc
    else:
        y = a
        y = y + 1
    z = _helper_twice(x + 1, QUANT)
    return y + z


def test_a_false_switch_drops_its_branch_and_an_elif_becomes_if():
    text = body(_kernel, TMA=False, QUANT=False, PDL=False)
    assert "tma(x)" not in text and "if TMA" not in text
    assert "if EVEN:\n    a = load(x)\nelse:\n    a = load(x, mask=True)" in text


def test_a_branch_left_alone_loses_its_if_and_moves_left():
    text = body(_kernel, TMA=False, QUANT=False, PDL=False)
    assert "y = a\ny = y + 1\n" in text and "else" not in text.split("y = a")[1]
    text = body(_kernel, TMA=True, QUANT=True, PDL=False)
    assert "a = tma(x)\n" in text and "EVEN" not in text and "y = a * sc\n" in text


def test_a_true_elif_becomes_the_else():
    def f(x, EVEN, TMA):
        if EVEN:
            a = 1
        elif TMA:
            a = 2
        else:
            a = 3
        return a + x

    assert body(f, TMA=True) == "if EVEN:\n    a = 1\nelse:\n    a = 2\nreturn a + x"
    assert body(f, TMA=False) == "if EVEN:\n    a = 1\nelse:\n    a = 3\nreturn a + x"


def test_conditions_keep_the_operands_the_switches_leave_open():
    def f(x, e, A, B):
        if e >= 0 and A:
            x = 1
        if A or B:
            x = 2
        if not B:
            x = 3
        if A == 2:
            x = 4
        return x

    assert body(f, A=False) == "if B:\n    x = 2\nif not B:\n    x = 3\nreturn x"
    assert body(f, A=2, B=True) == "if e >= 0:\n    x = 1\nx = 2\nx = 4\nreturn x"  # A=2 is true


def test_helpers_are_inlined_or_dropped_and_assignments_without_readers_go():
    text = body(_kernel, TMA=False, QUANT=False, PDL=False)
    assert "_helper_wait" not in text  # reduces to nothing with PDL off
    assert "_helper_scale" not in text and "sc =" not in text  # inlined to 1.0, then never read
    assert "s_e =" not in text  # its one reader went with the quantized branch
    assert "unused_before = 3  # noqa: F841" in text  # never read in the source either: shown as written
    lst = sp.specialise(_kernel, dict(TMA=False, QUANT=False, PDL=False))
    assert lst.inlined == 1 and lst.summary().endswith("lines dropped, 1 call inlined")


def test_an_argument_that_the_inlined_result_would_repeat_keeps_the_call():
    text = body(_kernel, TMA=False, QUANT=False, PDL=False)
    assert "z = _helper_twice(x + 1, QUANT)" in text  # x + 1 would be written twice


def test_with_the_switches_on_helpers_show_what_they_do_then():
    text = body(_kernel, TMA=False, QUANT=True, PDL=True)
    assert "_helper_wait(PDL)" in text  # a statement, not an expression: the call stays
    assert "sc = load(s_e)" in text and "s_e = s_ptr + 1" in text


def test_a_comment_on_a_rewritten_line_stays():
    def f(s_ptr, QUANT):
        s = _helper_scale(s_ptr, QUANT)  # the scale
        return s

    assert body(f, QUANT=False) == "s = 1.0  # the scale\nreturn s"


def test_the_summary_names_the_switches_the_source_uses():
    lst = sp.specialise(_kernel, dict(QUANT=False, TMA=False, W8A8=False))
    assert lst.switches == dict(QUANT=False, TMA=False)
    assert lst.summary().startswith("specialised: QUANT=False, TMA=False; ")
    assert lst.dropped == len(inspect.getsource(_kernel).splitlines()) - len(lst.lines)


@pytest.mark.parametrize("bad", [{}, None, {"NOPE": False}, [("QUANT", False)]])
def test_bad_switches_raise(bad):
    with pytest.raises(ValueError):
        sp.specialise(_kernel, bad)


def test_show_source_numbers_the_shown_lines_and_says_what_went(capsys):
    show_source(_kernel, specialise=dict(TMA=False, QUANT=False, PDL=False))
    out = capsys.readouterr().out.splitlines()
    numbered = [line for line in out if line[:3].strip().isdigit()]
    assert [int(line[:3]) for line in numbered] == list(range(1, len(numbered) + 1))
    assert out[-1].startswith("# specialised: TMA=False, QUANT=False, PDL=False; ")  # in the order given
    assert all(len(line) <= 88 for line in out)
    show_source(_kernel, specialise=dict(TMA=False), start=3, stop=4)
    out = capsys.readouterr().out.splitlines()
    assert [line[:3] for line in out[1:3]] == ["  3", "  4"] and len(out) == 4


def test_without_switches_show_source_is_unchanged(capsys):
    show_source(_kernel)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 + len(inspect.getsource(_kernel).splitlines())
    assert "specialised" not in out[-1]


# --- the package's kernels ------------------------------------------------------------------------

def _jit_functions():
    import importlib

    kernels = ["attention", "combine", "decode_fused", "decode_split", "dense_gemv", "fused_moe", "gated_rows",
               "gemv_kernels", "grouped_kernels", "helpers", "norm_rope", "p2p", "paged_attention", "pdl", "persistent",
               "quant_kernels", "routing", "sort", "trace"]
    names = [f"kernels.{n}" for n in kernels]
    mods = [importlib.import_module(f"dispatch.{n}") for n in names]
    for mod in mods:
        for name, obj in vars(mod).items():
            fn = getattr(obj, "fn", None)
            if inspect.isfunction(fn) and fn.__module__ == mod.__name__:
                yield f"{mod.__name__.rsplit('.', 1)[1]}.{name}", fn


@pytest.mark.parametrize("value", [False, True])
def test_every_kernel_specialises_to_valid_python(value):
    count = 0
    for name, fn in _jit_functions():
        names = {n.id for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn))))
                 if isinstance(n, ast.Name)}
        switches = {k: (0 if k == "NS" else False) if not value else (1 if k == "NS" else True)
                    for k in OFF if k in names}
        if not switches:
            continue
        lst = sp.specialise(fn, switches)
        ast.parse("\n".join(lst.lines))  # raises on a broken listing
        assert 0 <= lst.dropped < len(inspect.getsource(fn).splitlines()), name
        count += 1
    assert count >= 20


def test_the_grouped_up_tile_keeps_its_dot_and_store():
    text = "\n".join(sp.specialise(grouped_kernels._up_tile, OFF).lines)
    assert "acc_g = tl.dot(a, bg, acc_g)" in text and "acc_u = tl.dot(a, bu, acc_u)" in text
    assert "tl.store(h_ptrs, act.to(h_ptr.dtype.element_ty)" in text
    assert "act = gated(acc_g, acc_u, ACT)" in text  # the gated activation (SwiGLU's: kernels/helpers.py)
    for gone in ["_qdot", "_qacc", "_qout", "_block_scales", "_act_scales", "w_desc.load", "if TMA", "elif",
                 "if LATE_SCALE", "s_e = ", "n0 = "]:
        assert gone not in text, gone
    assert text.count("if EVEN_K:") == 2  # the TMA branch's elif now opens its chain


def test_the_kernels_lose_pdl_and_trace_when_they_are_off():
    text = "\n".join(sp.specialise(gemv_kernels._up_swiglu_kernel, OFF).lines)
    assert "pdl_enter" not in text and "pdl_exit" not in text
    assert "stamp" not in text and "record(" not in text and "t0" not in text
    assert "_up_item(item, tiles" in text
    text = "\n".join(sp.specialise(gemv_kernels._up_item, OFF).lines)
    assert "if NS > 0" not in text and "shared = " not in text and "acc_g = _tile_mac" in text


def test_quantized_switches_on_keep_the_scales():
    on = dict(OFF, QUANT=True)
    text = "\n".join(sp.specialise(grouped_kernels._up_tile, on).lines)
    assert "s_e = s_ptr + e * s[1]" in text and "if LATE_SCALE" not in text
    # _qdot's quantized branch calls a helper the grouped module does not import: it stays a call
    assert "acc_g = _qdot(a, sa, bg, sg, acc_g, QUANT, W8A8, LATE_SCALE, WFIRST)" in text
    assert "sg = tl.load(s_e + offs_n // SBR * s[2] + k0 * BLOCK_K // SBC * s[3], mask=mask_n, other=1.0)" in text


def _compiled(fn, switches, tmp_path, edit=lambda src: src):
    """The specialised source of ``fn`` (``edit``-ed) compiled as a jit function in its module's namespace."""
    src = edit("\n".join(sp.specialise(fn, switches).lines) + "\n")
    path = tmp_path / f"spec_{fn.__name__}.py"
    path.write_text(src)
    ns = {k: v for k, v in fn.__globals__.items() if not k.startswith("__")}
    exec(compile(src, str(path), "exec"), ns)  # a file on disk: Triton reads the source back
    return ns[fn.__name__]


def _case(T, H, I, E, K, seed):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    gu, dn = torch.randn(E, 2 * I, H, generator=g) / H ** 0.5, torch.randn(E, H, I, generator=g) / I ** 0.5
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    return x, torch.rand(T, K, generator=g), ids, gu, dn


def _grouped(case):
    from dispatch.kernels import grouped_gemm as gg
    from dispatch.kernels.tiles import GemmConfig

    cfg = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)  # H, I tails: EVEN_K off
    return gg.moe_experts(*case, config=cfg)


NO_SILU = lambda src: src.replace("gated(acc_g, acc_u, ACT)", "acc_g * acc_u")  # noqa: E731


@pytest.mark.parametrize("edit, same", [(lambda src: src, True), (NO_SILU, False)])
def test_the_specialised_grouped_tiles_compute_the_same_bits(tmp_path, monkeypatch, edit, same):
    """Compiled in place of the shipped tiles: the same bits; a listing with its SwiGLU changed (as a
    wrong specialisation might) gives other bits, so the comparison is not vacuous."""
    case = _case(9, 40, 24, 5, 2, seed=0)
    want = _grouped(case)
    for name in ["_up_tile", "_down_tile"]:
        fn = getattr(grouped_kernels, name).fn
        monkeypatch.setattr(grouped_kernels, name, _compiled(fn, OFF, tmp_path, edit))
    assert torch.equal(_grouped(case), want) == same


@pytest.mark.parametrize("edit, same", [(lambda src: src, True), (NO_SILU, False)])
def test_the_specialised_decode_kernel_computes_the_same_bits(tmp_path, monkeypatch, edit, same):
    case = _case(3, 40, 24, 6, 2, seed=1)
    want = gemv.moe_decode(*case)
    for name in ["_up_item", "_down_item"]:
        fn = getattr(gemv_kernels, name).fn
        monkeypatch.setattr(gemv_kernels, name, _compiled(fn, OFF, tmp_path, edit))
    monkeypatch.setattr(gemv, "_up_swiglu_kernel", _compiled(gemv_kernels._up_swiglu_kernel.fn, OFF, tmp_path))
    assert torch.equal(gemv.moe_decode(*case), want) == same
