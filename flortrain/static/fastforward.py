"""Fast-forward: the statements of a main loop's body a pseudoresume may leave out.

A parallel-replay worker, or ``record --resume``, that pseudoresumes runs main-loop iterations
whose output nobody reads, only to arrive at a later iteration in the record's state. DETrain
(Table 3) runs only what later iterations need. This is its backward *Needed* analysis over the
top-level statements of the main loop's body, with the loop's carried names, the names read
after the loop and the global RNG streams as state:

- a statement is **needed** when it writes a name the code after the loop reads, or one an
  iteration reads before binding it (carried: the iterations after the pseudoresume run every
  statement, the skippable ones too), or one a needed statement reads, or when it may do anything
  beyond binding names: a call the pass cannot prove pure (an optimizer or scheduler ``step``, a
  shuffle, a function of the script), an RNG draw, an attribute or item assigned, a file opened,
  control flow (``break``, ``return``, ``raise``). Its reads are then needed in turn, to a fixpoint
  over the loop's back edge;
- the rest is **skippable**: prints, logging calls, and evaluation passes that read tensors and
  modules and bind names nothing needed reads.

A statement the pass cannot classify is needed: leaving one out must never change an answer. A
memoized block inside a skippable statement is left out with it (its restore too), and that is
only right because nothing it changes is needed: a block that trains writes an optimizer or a
module, which no skippable statement may do.

What the pass cannot see is checked at run time, where the statement would run
(``runtime/fastforward.py``): the names it calls must hold modules in eval mode whose every
submodule's ``forward`` is PyTorch's own, with no hooks (such a forward draws nothing and
changes nothing), and the names it iterates or indexes must hold lists, tuples, ranges,
dicts, strings or tensors (a DataLoader draws its base seed from torch's global stream each
time it is iterated). A failed check runs the statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from flortrain.static.expressions import dotted, names_of, preorder
from flortrain.static.library import MUTATED_KEYWORDS, PURE_BUILTINS, PURE_METHODS
from flortrain.static.liveness import liveness_of, uses
from flortrain.static.plan import FastForward
from flortrain.static.program import Loop, Program, Scope
from flortrain.static.sinks import output_call
from flortrain.static.spans import read_before_bound

#: Builtins the pure ones (``library.PURE_BUILTINS``) include that an evaluation pass has no use
#: for or that do more than read: call what they are given, look at frames, read input, open.
_CALLING = frozenset({"map", "filter", "iter", "callable", "getattr", "hasattr"})
_INTROSPECTING = frozenset({"vars", "dir", "locals", "globals", "super", "type", "id", "hash"})
_OTHERS = frozenset({"input", "open", "object", "issubclass", "slice", "bytes", "bytearray"})
_NUMERALS = frozenset({"complex", "chr", "ord", "hex", "oct", "bin"})

#: Builtins that only read their arguments and call nothing the script passes them (no ``map``,
#: ``filter``, ``iter(f, sentinel)``; ``key=`` is refused where it is accepted).
BUILTINS = PURE_BUILTINS - _CALLING - _INTROSPECTING - _OTHERS - _NUMERALS

#: PyTorch functions (last dotted component, from a module imported from ``torch``) that compute
#: from their arguments and draw no random number: what an evaluation pass calls.
TORCH_FUNCTIONS = frozenset(
    {
        "cross_entropy",
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "binary_cross_entropy",
        "binary_cross_entropy_with_logits",
        "kl_div",
        "cosine_similarity",
        "softmax",
        "log_softmax",
        "sigmoid",
        "tanh",
        "relu",
        "argmax",
        "argmin",
        "sum",
        "mean",
        "max",
        "min",
        "exp",
        "log",
        "sqrt",
        "abs",
        "stack",
        "cat",
        "tensor",
        "zeros",
        "ones",
        "zeros_like",
        "ones_like",
        "arange",
        "eq",
        "equal",
        "allclose",
        "isclose",
        "norm",
        "matmul",
        "topk",
        "where",
        "clamp",
        "numel",
        "round",
        "floor",
    }
)

#: Builtins that iterate their arguments: a name passed is checked as an iterated one.
ITERATING = frozenset(
    {"zip", "enumerate", "list", "tuple", "set", "frozenset", "dict", "sorted", "reversed"}
    | {"sum", "min", "max", "any", "all"}
)

#: Context managers an evaluation pass may run under.
GRAD_MODES = frozenset({"no_grad", "inference_mode", "enable_grad"})

#: Methods that change only a list the statement made itself (``preds.append(p)``).
LOCAL_GROWTH = frozenset({"append", "extend"})

#: A print that writes somewhere else than stdout writes a file: needed.
PRINT_KEYWORDS = frozenset({"sep", "end", "flush"})


@dataclass
class _Judge:
    """Whether one top-level statement may be left out, and what the run-time check must see."""

    prog: Program
    scope: Scope
    modules: set[str] = field(default_factory=set)
    containers: set[str] = field(default_factory=set)
    fresh: set[str] = field(default_factory=set)  # names bound here to values made here
    #: names the statement binds: what they hold comes from checked values and pure calls
    local: set[str] = field(default_factory=set)

    def statement(self, s: cst.CSTNode) -> str | None:
        """Why ``s`` is needed whatever it binds (None: it only reads and binds names)."""
        if isinstance(s, cst.SimpleStatementLine):
            return _first(self.small(x) for x in s.body)
        if isinstance(s, cst.If):
            return _first([self.expr(s.test), self.suite(s.body), self.suite(s.orelse)])
        if isinstance(s, cst.Else):
            return self.suite(s.body)
        if isinstance(s, cst.For):
            if s.asynchronous is not None:
                return "an async loop"
            why = self.iterated(s.iter) or self.expr(s.iter) or self.suite(s.orelse)
            self.fresh -= set(names_of(s.target))
            # twice: what the body rebinds reaches its next iteration
            return why or self.suite(s.body) or self.suite(s.body)
        if isinstance(s, cst.With):
            if s.asynchronous is not None:
                return "an async `with`"
            return _first([*(self.grad_mode(i) for i in s.items), self.suite(s.body)])
        return f"a `{_keyword(s)}` statement"

    def suite(self, body: cst.BaseSuite | cst.CSTNode | None) -> str | None:
        if body is None:
            return None
        if isinstance(body, cst.SimpleStatementSuite):
            return _first(self.small(x) for x in body.body)
        if isinstance(body, cst.IndentedBlock):
            return _first(self.statement(x) for x in body.body)
        return self.statement(body)

    def small(self, s: cst.BaseSmallStatement) -> str | None:
        if isinstance(s, cst.Pass):
            return None
        if isinstance(s, cst.Expr):
            return self.call_statement(s.value)
        if isinstance(s, cst.Assign):
            if not all(isinstance(t.target, cst.Name | cst.Tuple | cst.List) for t in s.targets):
                return "assigns an attribute or an item"
            unpacks = any(isinstance(t.target, cst.Tuple | cst.List) for t in s.targets)
            why = (self.iterated(s.value) if unpacks else None) or self.expr(s.value)
            bound = {n for t in s.targets for n in names_of(t.target)}
            if _fresh_value(s.value) and len(bound) == 1:
                self.fresh |= bound
            else:
                self.fresh -= bound
            return why
        if isinstance(s, cst.AugAssign):
            if not isinstance(s.target, cst.Name) or s.target.value not in self.fresh:
                return "updates a value it did not make (`+=` may change an object in place)"
            return self.expr(s.value)
        return f"a `{_keyword(s)}` statement"

    def call_statement(self, value: cst.BaseExpression) -> str | None:
        """An expression statement: a print, a logging call, or a pure call."""
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
            kind = output_call(self.prog, self.scope, value.func)
            if kind == "logger":
                return _first(self.expr(a.value) for a in value.args)
            func = value.func
            if (
                func.attr.value in LOCAL_GROWTH
                and isinstance(func.value, cst.Name)
                and func.value.value in self.fresh
            ):
                return _first(self.expr(a.value) for a in value.args)
        return self.expr(value)

    def grad_mode(self, item: cst.WithItem) -> str | None:
        name = dotted(item.item.func) if isinstance(item.item, cst.Call) else None
        origin = self.origin(name) if name is not None else None
        if item.asname is None and origin is not None and origin.rsplit(".", 1)[-1] in GRAD_MODES:
            return None
        return "a `with` other than torch.no_grad() or torch.inference_mode()"

    def iterated(self, it: cst.BaseExpression) -> str | None:
        """A value iterated, indexed, or whose pure method is called: a name is checked at run
        time unless the statement bound it (then it holds what checked values and pure calls
        made), a call's result is judged with the call; an attribute or item, by what it is
        taken from."""
        while isinstance(it, cst.Attribute | cst.Subscript):
            it = it.value
        if isinstance(it, cst.Name):
            if it.value not in self.local:
                self.containers.add(it.value)
            return None
        if isinstance(it, cst.Call | cst.SimpleString | cst.FormattedString | cst.Integer):
            return None
        return self.expr(it)

    def expr(self, e: cst.CSTNode | None) -> str | None:
        """Why evaluating ``e`` may do more than read (None: it only reads)."""
        stack: list[cst.CSTNode] = [] if e is None else [e]
        while stack:
            n = stack.pop()
            if isinstance(n, cst.Call):
                why = self.call(n)
                if why is not None:
                    return why
            elif isinstance(n, cst.Subscript):
                why = self.iterated(n.value)
                if why is not None:
                    return why
            elif isinstance(n, cst.CompFor):
                if n.asynchronous is not None:
                    return "an async comprehension"
                why = self.iterated(n.iter)
                if why is not None:
                    return why
            elif isinstance(n, cst.StarredElement | cst.StarredDictElement):
                why = self.iterated(n.value)  # `[*xs]`, `{**d}` iterate
                if why is not None:
                    return why
            elif isinstance(n, cst.ComparisonTarget) and isinstance(n.operator, cst.In | cst.NotIn):
                why = self.iterated(n.comparator)  # `x in xs` may iterate `xs`
                if why is not None:
                    return why
            elif isinstance(n, cst.Yield | cst.Await | cst.NamedExpr):
                return f"evaluates a `{type(n).__name__}`"
            stack.extend(n.children)
        return None

    def call(self, c: cst.Call) -> str | None:
        for a in c.args:
            if a.keyword is not None and a.keyword.value in MUTATED_KEYWORDS:
                return f"passes `{a.keyword.value}=`, which a call writes into"
            if a.star:  # `f(*xs)` iterates `xs`
                why = self.iterated(a.value)
                if why is not None:
                    return why
        func = c.func
        if isinstance(func, cst.Name):
            return self.name_call(func.value, c)
        name = dotted(func)
        origin = self.origin(name) if name is not None else None
        if origin is not None:
            last = origin.rsplit(".", 1)[-1]
            ok = origin.startswith("torch.") and last in TORCH_FUNCTIONS
            return None if ok else f"calls `{name}()`, not known to draw nothing and change nothing"
        if isinstance(func, cst.Attribute):
            m = func.attr.value
            if m not in PURE_METHODS or m.endswith("_"):
                return f"calls `.{m}()`, which may change its receiver"
            return self.iterated(func.value)
        return "calls what an expression returns"

    def name_call(self, name: str, c: cst.Call) -> str | None:
        owner = self.prog.binding_scope(self.scope, name)
        if owner is None:
            if name not in BUILTINS:
                return f"calls `{name}()`"
            keywords = {a.keyword.value for a in c.args if a.keyword is not None}
            if name in ITERATING:
                for a in c.args:
                    why = self.iterated(a.value)
                    if why is not None:
                        return why
            if name == "print" and keywords - PRINT_KEYWORDS:
                return "prints to a file"
            if "key" in keywords:
                return f"calls `{name}()` with a `key=` function"
            return None
        origin = self.origin(name)
        if origin is not None:
            last = origin.rsplit(".", 1)[-1]
            if origin.startswith("torch.") and last in TORCH_FUNCTIONS:
                return None
            return f"calls `{name}()`, not known to draw nothing and change nothing"
        if (
            self.prog.resolve_call(c, self.scope) is not None
            or name in self.prog.classes
            or name in self.prog.scopes
        ):
            return f"calls `{name}()`, a function of the script"
        if name in self.local:
            return f"calls `{name}`, which it binds itself"
        self.modules.add(name)  # a module's forward: checked at run time
        return None

    def origin(self, name: str) -> str | None:
        """The dotted import path ``name`` (``F.mse_loss``) stands for, when its first part is an
        import no assignment in the scope rebinds."""
        top, _, rest = name.partition(".")
        origin = self.prog.import_origin(top)
        if origin is None:
            return None
        owner = self.prog.binding_scope(self.scope, top)
        if owner is not None and (
            top in owner.params or any(v is not None for v in owner.assigned.get(top, []))
        ):
            return None
        return f"{origin}.{rest}" if rest else origin


def _first(whys: object) -> str | None:
    for w in whys:  # type: ignore[attr-defined]
        if w is not None:
            return str(w)
    return None


def _keyword(s: cst.CSTNode) -> str:
    name = type(s).__name__
    return {"FunctionDef": "def", "ClassDef": "class", "AnnAssign": "annotated assignment"}.get(
        name, name.lower()
    )


def _fresh_value(v: cst.BaseExpression) -> bool:
    """A value the assignment makes, shared with nothing: a number, a string, an empty or
    literal display, or a Python number read off a tensor (``.item()``, ``float(..)``)."""
    if isinstance(v, cst.Integer | cst.Float | cst.SimpleString | cst.FormattedString):
        return True
    if isinstance(v, cst.List | cst.Dict | cst.Tuple) and not v.elements:
        return True
    if isinstance(v, cst.UnaryOperation):
        return _fresh_value(v.expression)
    if isinstance(v, cst.Call):
        if isinstance(v.func, cst.Attribute) and v.func.attr.value in ("item", "tolist"):
            return True
        return isinstance(v.func, cst.Name) and v.func.value in ("float", "int", "len", "str")
    return False


def bound_here(node: cst.CSTNode) -> set[str]:
    """The names ``node`` binds, comprehension variables included."""
    out = writes(node)
    for n in preorder(node):
        if isinstance(n, cst.CompFor):
            out.update(names_of(n.target))
    return out


def writes(node: cst.CSTNode) -> set[str]:
    """The names ``node`` binds (comprehension variables are their own scope's)."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, cst.AssignTarget | cst.AugAssign | cst.AnnAssign | cst.For):
            out.update(names_of(n.target))
        elif isinstance(n, cst.WithItem) and n.asname is not None:
            out.update(names_of(n.asname.name))
        elif isinstance(n, cst.NamedExpr):
            out.update(names_of(n.target))
        if isinstance(n, cst.CompFor | cst.Lambda | cst.FunctionDef | cst.ClassDef):
            continue
        stack.extend(n.children)
    return out


@dataclass(frozen=True)
class Verdict:
    """One top-level statement of the main loop's body: skippable (``why`` empty) or needed."""

    line: int
    why: str
    step: FastForward | None


def fast_forward(prog: Program, loop: Loop) -> tuple[tuple[FastForward, ...], tuple[Verdict, ...]]:
    """The statements of ``loop``'s body a pseudoresume may leave out, and a verdict on each."""
    body = loop.body
    if not isinstance(body, cst.IndentedBlock):
        return (), ()
    scope = prog.loop_scope[loop]
    live = liveness_of(prog).after(loop)
    if live is None:
        line = prog.line(body.body[0]) if body.body else prog.line(loop)
        return (), (Verdict(line, "the scope reads its own variables (locals(), eval)", None),)
    needed = set(live) | set(scope.declared_global) | set(scope.declared_nonlocal)
    # the iterations after the pseudoresume run every statement: what any of them reads before
    # binding it (carried, ``best = min(best, val)``) is needed, whoever reads it
    binds = [bound_here(s) for s in body.body]
    carried = {n for n in set().union(*binds) if read_before_bound(loop, n)}
    needed |= carried
    if isinstance(loop, cst.While):
        needed |= set(uses(prog, loop.test))
    if loop.orelse is not None:
        needed |= set(uses(prog, loop.orelse))
    judged: list[tuple[cst.BaseStatement, str | None, _Judge]] = []
    for k, s in enumerate(body.body):
        # a name only this statement binds, and no iteration reads before binding it, holds
        # what this statement made from checked values (its last run, or none yet)
        others = set().union(*(b for i, b in enumerate(binds) if i != k))
        j = _Judge(prog, scope, local=binds[k] - others - carried)
        judged.append((s, j.statement(s), j))
    changed = True
    while changed:  # the body's top feeds its end through the back edge: to a fixpoint
        changed = False
        for s, why, _ in reversed(judged):
            if why is None and not writes(s) & needed:
                continue
            new = set(uses(prog, s))
            if not new <= needed:
                needed |= new
                changed = True
    steps: list[FastForward] = []
    verdicts: list[Verdict] = []
    for s, why, j in judged:
        line = prog.line(s)
        hit = sorted(writes(s) & needed)
        if why is None and not hit:
            r = prog.range(s)
            step = FastForward(
                line,
                r.end.line,
                tuple(sorted(j.modules)),
                tuple(sorted(j.containers)),
                tuple(sorted(writes(s))),
            )
            steps.append(step)
            verdicts.append(Verdict(line, "", step))
        else:
            verdicts.append(Verdict(line, why or f"binds `{hit[0]}`, which is needed", None))
    return tuple(steps), tuple(verdicts)


__all__ = ["BUILTINS", "TORCH_FUNCTIONS", "Verdict", "fast_forward", "writes"]
