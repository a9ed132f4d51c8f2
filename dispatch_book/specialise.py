"""A kernel's source specialised to a chapter: what the switches that are off in it leave.

The package's kernels carry constexpr switches for later chapters (``QUANT``, ``W8A8``, ``TMA``,
``PDL``, ``TRACE``, ``NS`` shared experts, ...). ``specialise(fn, {"QUANT": False, "TMA": False})``
reads ``fn``'s source with :mod:`ast` and returns the lines a reader of an earlier chapter needs:

* an ``if``/``elif``/``else`` chain keeps only the branches the switches leave possible: a branch
  whose condition they make false goes, one they make true ends the chain (as its ``else``), a
  branch left alone loses its ``if`` line and moves one level left, an ``elif`` left first
  becomes ``if``. Conditions on other names (``EVEN_K``, ``e >= 0``) stay as written.
* a call that passes a switch to a helper (a function of the package) is replaced by the helper's
  result where the helper, specialised the same way, reduces to one expression
  (``acc = _qdot(a, s, b, s_n, acc, QUANT, ...)`` becomes ``acc = tl.dot(a, b, acc)``), and dropped
  where it reduces to nothing (``pdl_enter(PDL)`` with ``PDL=False``).
* an assignment whose every reader went in those steps goes too, when its value is plain
  arithmetic (a scale pointer that only the quantized branch read).

Every other line is shown as written. ``Listing.summary()`` says what was dropped.
"""
from __future__ import annotations

import ast
import builtins
import copy
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
from collections import Counter

_UNKNOWN = object()
_MAX_DEPTH = 6  # helpers calling helpers: deep enough for the package's kernels
# Calls whose value depends only on their arguments (a dead assignment of one may go).
_PURE = frozenset({"zeros", "full", "arange", "where", "trans", "maximum", "minimum", "cdiv", "sigmoid", "exp",
                   "abs", "program_id", "num_programs", "cast", "reshape", "broadcast_to", "expand_dims",
                   "zeros_like", "full_like", "sqrt", "log", "to"})


@dataclasses.dataclass(frozen=True)
class Listing:
    """A function's source as shown: ``lines``; ``switches``: those given that its source names."""

    name: str
    path: str
    lines: tuple[str, ...]
    switches: dict
    dropped: int  # source lines not shown
    inlined: int  # helper calls replaced by their result

    def summary(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self.switches.items())
        what = f"{self.dropped} line{'' if self.dropped == 1 else 's'} dropped"
        if self.inlined:
            what += f", {self.inlined} call{'' if self.inlined == 1 else 's'} inlined"
        return f"specialised: {given}; {what}"


def specialise(fn, switches: dict) -> Listing:
    """``fn`` (a function or a ``@triton.jit`` one) with the ``switches`` (name → value) applied."""
    if not isinstance(switches, dict) or not switches or not all(isinstance(k, str) for k in switches):
        raise ValueError(f"switches must be a non-empty dict of name -> value, got {switches!r}")
    py, lines, tree = _parse(getattr(fn, "fn", fn))
    named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    used = {k: v for k, v in switches.items() if k in named}
    if not used:
        raise ValueError(f"{py.__name__} names none of the switches {sorted(switches)}")
    spec = _Specialiser(py, used)
    shown = spec.render()
    return Listing(py.__name__, inspect.getsourcefile(py) or "?", tuple(shown), used,
                   len(lines) - len(shown), spec.inlined)


@functools.lru_cache(maxsize=None)
def _parse(py) -> tuple:
    """(function, its source lines dedented, its ``FunctionDef``)."""
    if not inspect.isfunction(py):
        raise TypeError(f"expected a function, got {type(py).__name__}")
    src = textwrap.dedent(inspect.getsource(py))
    tree = ast.parse(src).body[0]
    if not isinstance(tree, ast.FunctionDef):
        raise TypeError(f"{py.__name__}: its source is not a function definition")
    return py, tuple(src.splitlines()), tree


def _eval(node, env):
    """The value of a condition under ``env``, or ``_UNKNOWN`` where it names anything else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        v = _eval(node.operand, env)
        return _UNKNOWN if v is _UNKNOWN else not v
    if isinstance(node, ast.BoolOp):
        vs = [_eval(v, env) for v in node.values]
        stop = isinstance(node.op, ast.Or)  # the value that decides: any true (or), any false (and)
        if any(v is not _UNKNOWN and bool(v) == stop for v in vs):
            return stop
        return _UNKNOWN if any(v is _UNKNOWN for v in vs) else not stop
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        a, b = _eval(node.left, env), _eval(node.comparators[0], env)
        ops = {ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__", ast.Gt: "__gt__",
               ast.GtE: "__ge__"}
        op = ops.get(type(node.ops[0]))
        if a is not _UNKNOWN and b is not _UNKNOWN and op:
            r = getattr(a, op)(b)
            return _UNKNOWN if r is NotImplemented else bool(r)
    return _UNKNOWN


def _simplify(node, env):
    """``node`` with the operands the switches decide taken out (``A and B`` with A true: ``B``);
    ``node`` itself where nothing changes. Called only on conditions the switches leave undecided."""
    if isinstance(node, ast.BoolOp):
        keep_if = isinstance(node.op, ast.And)  # and: a true operand goes; or: a false one
        rest, changed = [], False
        for v in node.values:
            t = _truth(_eval(v, env))
            if t is _UNKNOWN:
                new = _simplify(v, env)
                changed |= new is not v
                rest.append(new)
            else:
                changed = True
                if t != keep_if:
                    return ast.Constant(t)
        if not changed:
            return node
        return rest[0] if len(rest) == 1 else ast.BoolOp(op=node.op, values=rest)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        new = _simplify(node.operand, env)
        return node if new is node.operand else ast.UnaryOp(op=ast.Not(), operand=new)
    return node


def _truth(v):
    return v if v is _UNKNOWN else bool(v)


def _loads(stmts) -> Counter:
    """How often each name is read in ``stmts`` (``x += 1`` reads x)."""
    c = Counter()
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                c[n.id] += 1
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
                c[n.target.id] += 1
    return c


def _assigned(s) -> list[str]:
    """The names ``s`` assigns when it is ``x = ...`` or ``x, y = ...`` (else [])."""
    if not isinstance(s, ast.Assign) or len(s.targets) != 1:
        return []
    t = s.targets[0]
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts):
        return [e.id for e in t.elts]
    return []


def _unparse(s) -> str:
    """A statement as source; ``a, b = x, y`` without the parentheses ``ast.unparse`` adds."""
    def bare(node):
        if isinstance(node, ast.Tuple) and node.elts:
            return ", ".join(ast.unparse(e) for e in node.elts)
        return ast.unparse(node)

    if isinstance(s, ast.Assign):
        return " = ".join([*(bare(t) for t in s.targets), bare(s.value)])
    return ast.unparse(s)


def _pure(node) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if not (isinstance(f, ast.Attribute) and f.attr in _PURE):
                return False
        elif isinstance(n, (ast.NamedExpr, ast.Await, ast.Yield, ast.YieldFrom, ast.Lambda)):
            return False
    return True


def _empty(stmts) -> bool:
    """Nothing left but a docstring, ``pass`` or a bare ``return``."""
    return all(isinstance(s, ast.Pass) or (isinstance(s, ast.Return) and s.value is None)
               or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)) for s in stmts)


class _Subst(ast.NodeTransformer):
    def __init__(self, values):
        self.values = values

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.values:
            return copy.deepcopy(self.values[node.id])
        return node


class _Specialiser:
    """One function's source under ``env``: line edits for the listing, and its effective body."""

    def __init__(self, py, env: dict, depth: int = 0):
        self.py, self.lines, self.tree = _parse(py)
        self.env, self.depth = env, depth
        self.drop: set[int] = set()
        self.dedent: Counter = Counter()
        self.replace: dict[int, str] = {}
        self.inlined = 0
        self.origin: dict[int, tuple] = {}  # id(effective statement) -> (it, the source's statement)
        args = self.tree.args
        self.locals = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs} | {
            n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        self.body = self._block(self.tree.body)
        self._dead_code()

    # -- the listing
    def render(self) -> list[str]:
        out = []
        for i, line in enumerate(self.lines, 1):
            if i in self.drop:
                continue
            text = self.replace.get(i, line)
            strip = min(self.dedent[i], len(text) - len(text.lstrip(" ")))
            out.append(text[strip:])
        return out

    def _drop(self, first: int, last: int) -> None:
        for i in range(first, last + 1):
            self.drop.add(i)
            self.replace.pop(i, None)

    def _set(self, line: int, text: str) -> None:
        self.replace[line] = text
        self.drop.discard(line)

    # -- statements
    def _block(self, stmts) -> list:
        out = []
        for s in stmts:
            for new in self._stmt(s):
                if self.origin.get(id(new), (None,))[0] is not new:  # a collapsed if's body keeps its own
                    self.origin[id(new)] = (new, s)
                out.append(new)
        return out

    def _stmt(self, s) -> list:
        if isinstance(s, ast.If):
            return self._if(s)
        if isinstance(s, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)):
            new = copy.copy(s)
            for field in ("body", "orelse", "finalbody"):
                if hasattr(s, field):
                    setattr(new, field, self._block(getattr(s, field)))
            if isinstance(s, ast.Try):
                new.handlers = [copy.copy(h) for h in s.handlers]
                for h, h0 in zip(new.handlers, s.handlers, strict=True):
                    h.body = self._block(h0.body)
            if not new.body and isinstance(s, (ast.For, ast.AsyncFor)) and not s.orelse:
                self._drop(s.lineno, s.end_lineno)  # a loop left with nothing to do
                return []
            return [new]
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return [s]
        return self._simple(s)

    def _simple(self, s) -> list:
        if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call):
            callee = self._callee(s.value)
            if callee and _empty(_specialised(*callee, self.depth + 1).body):
                self._drop(s.lineno, s.end_lineno)
                return []
        inliner = _Inline(self)
        new = inliner.visit(copy.deepcopy(s))
        if not inliner.count:
            return [s]
        if isinstance(new, ast.Assign) and len(new.targets) == 1 and \
                ast.dump(new.targets[0]).replace("Store", "Load") == ast.dump(new.value):
            self._drop(s.lineno, s.end_lineno)  # x = x: the helper returned its argument
            return []
        self.inlined += inliner.count
        self._drop(s.lineno, s.end_lineno)
        self._set(s.lineno, " " * s.col_offset + _unparse(new) + self._comment(s.lineno, s.end_lineno))
        return [new]

    def _comment(self, first: int, last: int) -> str:
        """The first comment on lines first..last (with two spaces before it), or ''."""
        text = "\n".join(self.lines[first - 1:last]) + "\n"
        try:
            for tok in tokenize.generate_tokens(io.StringIO(text).readline):
                if tok.type == tokenize.COMMENT:
                    return "  " + tok.string
        except (tokenize.TokenError, IndentationError):
            pass
        return ""

    # -- if / elif / else
    def _clauses(self, s) -> list[dict]:
        """The chain of ``s``: [{node, kind ('if'|'elif'|'else'), test, body, start, end}] in order."""
        out = [dict(node=s, kind="if", test=s.test, body=s.body, start=s.lineno)]
        node = s
        while node.orelse:
            first = node.orelse[0]
            if len(node.orelse) == 1 and isinstance(first, ast.If) and \
                    self.lines[first.lineno - 1].lstrip().startswith("elif"):
                out.append(dict(node=first, kind="elif", test=first.test, body=first.body, start=first.lineno))
                node = first
                continue
            after = node.body[-1].end_lineno + 1
            start = next(i for i in range(after, first.lineno + 1)
                         if self.lines[i - 1].lstrip().startswith("else"))
            out.append(dict(node=node, kind="else", test=None, body=node.orelse, start=start))
            break
        for c, nxt in zip(out, out[1:] + [None], strict=True):
            c["end"] = nxt["start"] - 1 if nxt else s.end_lineno
        return out

    def _if(self, s) -> list:
        clauses = self._clauses(s)
        values = [True if c["test"] is None else _truth(_eval(c["test"], self.env)) for c in clauses]
        if all(v is _UNKNOWN for c, v in zip(clauses, values, strict=True) if c["test"] is not None):
            kept = [(c, False) for c in clauses]
        else:
            kept = []
            for i, (c, v) in enumerate(zip(clauses, values, strict=True)):
                if v is False:
                    self._drop(c["start"], c["end"])
                elif v is True:
                    kept.append((c, True))
                    for later in clauses[i + 1:]:
                        self._drop(later["start"], later["end"])
                    break
                else:
                    kept.append((c, False))
        if not kept:
            return []
        c, always = kept[0]
        if always or c["test"] is None:  # one body left, always run: it replaces the if
            body0 = c["body"][0]
            if body0.lineno == c["start"]:  # `if X: stmt` on one line
                self._set(c["start"], " " * s.col_offset + self.lines[c["start"] - 1][body0.col_offset:])
            else:
                self._drop(c["start"], body0.lineno - 1)
                for i in range(body0.lineno, c["end"] + 1):
                    self.dedent[i] += body0.col_offset - s.col_offset
            return self._block(c["body"])
        chain = []
        for i, (c, always) in enumerate(kept):
            want = "if" if i == 0 else "else" if always or c["test"] is None else "elif"
            test = None if want == "else" else _simplify(c["test"], self.env)
            if test is not None and test is not c["test"]:  # `A and B` with A on: `B`
                first = c["body"][0].lineno
                self._drop(c["start"], max(c["start"], first - 1))
                self._set(c["start"], f"{' ' * s.col_offset}{want} {ast.unparse(test)}:"
                                      + self._comment(c["start"], max(c["start"], first - 1)))
            elif want != c["kind"]:
                self._rekey(c, want, s.col_offset)
            body = self._block(c["body"])
            if not body:  # every statement of a kept branch went: Python needs one
                first = c["body"][0]
                self._set(first.lineno, " " * first.col_offset + "pass")
                body = [ast.Pass()]
            chain.append((test, body))
        orelse = []
        for test, body in reversed(chain):
            orelse = body if test is None else [ast.If(test=test, body=body, orelse=orelse)]
        return orelse

    def _rekey(self, c, want: str, col: int) -> None:
        """Rewrite a clause's header to start with ``want`` (``elif`` → ``if``, a decided one → ``else``)."""
        first = c["body"][0].lineno
        head = self.lines[c["start"] - 1]
        if want == "else":
            self._drop(c["start"], max(c["start"], first - 1))
            self._set(c["start"], " " * col + "else:")
        else:
            rest = head.lstrip()
            self._set(c["start"], head[:len(head) - len(rest)] + want + rest[len(c["kind"]):])

    # -- helpers of the package
    def _callee(self, call) -> tuple | None:
        """(helper, its switches) for a call that passes a switch to a function of the package."""
        if self.depth >= _MAX_DEPTH or not isinstance(call.func, ast.Name):
            return None
        obj = self.py.__globals__.get(call.func.id)
        target = getattr(obj, "fn", obj)
        if not inspect.isfunction(target):
            return None
        args = self._bind(target, call)
        if args is None or not any(isinstance(a, ast.Name) and a.id in self.env for a in args.values()):
            return None
        env = {}
        for p, a in args.items():
            if isinstance(a, ast.Name) and a.id in self.env:
                env[p] = self.env[a.id]
            elif isinstance(a, ast.Constant):
                env[p] = a.value
        return target, env

    @staticmethod
    def _bind(target, call) -> dict | None:
        """{parameter: argument expression} of ``call`` to ``target`` (defaults filled in), or None."""
        a = _parse(target)[2].args
        if a.vararg or a.kwarg or any(isinstance(x, ast.Starred) for x in call.args) or \
                any(k.arg is None for k in call.keywords):
            return None
        params = [p.arg for p in a.posonlyargs + a.args]
        if len(call.args) > len(params):
            return None
        bound = dict(zip(params, call.args, strict=False))
        for k in call.keywords:
            bound[k.arg] = k.value
        for p, d in zip(params[len(params) - len(a.defaults):], a.defaults, strict=True):
            bound.setdefault(p, d)
        for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
            if d is not None:
                bound.setdefault(p.arg, d)
        return bound if set(bound) == set(params) | {p.arg for p in a.kwonlyargs} else None

    def _compose(self, call):
        """The expression ``call`` reduces to (its helper specialised), or None."""
        callee = self._callee(call)
        if callee is None:
            return None
        target, env = callee
        inner = _specialised(target, env, self.depth + 1)
        body = [s for s in inner.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
            return None
        values: dict = {}
        for s in body[:-1]:
            if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name):
                values[s.targets[0].id] = _Subst(values).visit(copy.deepcopy(s.value))
            elif isinstance(s, ast.AugAssign) and isinstance(s.target, ast.Name) and s.target.id in values:
                values[s.target.id] = ast.BinOp(values[s.target.id], s.op, _Subst(values).visit(copy.deepcopy(s.value)))
            elif isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Tuple) and \
                    isinstance(s.value, ast.Tuple) and len(s.value.elts) == len(s.targets[0].elts) and \
                    all(isinstance(t, ast.Name) for t in s.targets[0].elts):
                new = [_Subst(values).visit(copy.deepcopy(v)) for v in s.value.elts]
                values.update({t.id: v for t, v in zip(s.targets[0].elts, new, strict=True)})
            else:
                return None
        expr = _Subst(values).visit(copy.deepcopy(body[-1].value))
        args = self._bind(target, call)
        uses = Counter(n.id for n in ast.walk(expr) if isinstance(n, ast.Name))
        callee_locals = _Specialiser.locals_of(target)
        for name in uses:
            if name in args:
                simple = isinstance(args[name], (ast.Name, ast.Constant, ast.Attribute))
                if uses[name] > 1 and not simple:
                    return None  # the argument would be computed twice in the listing
            elif name in callee_locals or name in self.locals:
                return None  # a local the composition could not resolve, or one the caller's would capture
            elif target.__globals__.get(name, _UNKNOWN) is not self.py.__globals__.get(name, _UNKNOWN) \
                    and not hasattr(builtins, name):
                return None  # a global of the helper's module that the caller's does not share
        return _Subst(args).visit(expr)

    @staticmethod
    def locals_of(target) -> set:
        tree = _parse(target)[2]
        a = tree.args
        return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)} - {
            p.arg for p in a.posonlyargs + a.args + a.kwonlyargs}

    # -- assignments left without a reader
    def _dead_code(self) -> None:
        before = _loads(self.tree.body)
        while True:
            now = _loads(self.body)
            hit = self._find_dead(self.body, before, now)
            if hit is None:
                return
            block, s = hit
            block.remove(s)
            src = self.origin[id(s)][1]
            self._drop(src.lineno, src.end_lineno)

    def _find_dead(self, block, before, now):
        for s in block:
            names = _assigned(s)
            if names and all(before[n] and not now[n] for n in names) and _pure(s.value):
                return block, s
            for field in ("body", "orelse", "finalbody"):
                sub = getattr(s, field, None)
                if isinstance(sub, list):
                    hit = self._find_dead(sub, before, now)
                    if hit:
                        return hit
        return None


def _specialised(target, env: dict, depth: int) -> _Specialiser:
    """A helper specialised (read only: cached per helper and switches)."""
    return _cached(target, tuple(sorted(env.items())), depth)


@functools.lru_cache(maxsize=256)
def _cached(target, env: tuple, depth: int) -> _Specialiser:
    return _Specialiser(target, dict(env), depth)


class _Inline(ast.NodeTransformer):
    """Replaces, inside one statement, each helper call that reduces to an expression, and each
    ``a if SWITCH else b`` the switches decide."""

    def __init__(self, spec: _Specialiser):
        self.spec, self.count = spec, 0

    def visit_Call(self, node):
        self.generic_visit(node)
        expr = self.spec._compose(node)
        if expr is None:
            return node
        self.count += 1
        return expr

    def visit_IfExp(self, node):
        self.generic_visit(node)
        v = _truth(_eval(node.test, self.spec.env))
        if v is _UNKNOWN:
            return node
        self.count += 1
        return node.body if v else node.orelse
