"""Where a seed's value comes from: the clock, the process id, OS entropy, or an environment
variable read with no default, followed through simple assignments (``seed = int(time.time())``
then ``torch.manual_seed(seed)``; ``self.seed = ...`` in a method) and into the script's own
seeding helpers' parameters (``set_seed(int(time.time()))``)."""

from __future__ import annotations

import weakref

import libcst as cst

from flortrain.check import seeding
from flortrain.check.flow import callee, nodes
from flortrain.check.unit import Unit
from flortrain.static.arguments import bind_params
from flortrain.static.program import Scope

#: values that differ run to run, by qualified name, with what they are
_VOLATILE = {
    **{
        f"time.{n}": "the clock"
        for n in (
            "time",
            "time_ns",
            "perf_counter",
            "perf_counter_ns",
            "monotonic",
            "monotonic_ns",
            "process_time",
            "process_time_ns",
            "clock_gettime",
            "clock_gettime_ns",
        )
    },
    "datetime.datetime.now": "the clock",
    "datetime.datetime.utcnow": "the clock",
    "datetime.datetime.today": "the clock",
    "datetime.date.today": "the clock",
    "os.getpid": "the process id",
    "os.getppid": "the process id",
    "threading.get_ident": "the thread id",
    "threading.get_native_id": "the thread id",
    "os.urandom": "OS entropy",
    "uuid.uuid1": "the clock",
    "uuid.uuid4": "OS entropy",
    "secrets.randbits": "OS entropy",
    "secrets.randbelow": "OS entropy",
    "secrets.token_bytes": "OS entropy",
    "secrets.token_hex": "OS entropy",
    "random.SystemRandom": "OS entropy",
    "torch.seed": "OS entropy",
    "builtins.id": "an object's address",
}
#: reads of the environment that give None when the variable is unset
_ENV_GETS = frozenset({"os.environ.get", "os.getenv"})
_DEPTH = 4


def origin(
    unit: Unit, scope: Scope, expr: cst.BaseExpression, _depth: int = 0, _top: bool = True
) -> str | None:
    """What makes ``expr`` differ run to run ("the clock (`time.time`)"), or None."""
    if _depth > _DEPTH:
        return None
    if isinstance(expr, cst.Call):
        for q in unit.called(expr):
            if q in _VOLATILE:
                return f"{_VOLATILE[q]} (`{q}`)"
            if q == "builtins.hash" and not _numeric(expr):
                return "the per-process string hash (`hash`)"
            if q in _ENV_GETS and _top and len(expr.args) < 2:
                return f"an environment variable with no default (`{q}`), None when unset"
    if isinstance(expr, cst.Name):
        return _through_name(unit, scope, expr.value, _depth)
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        found = _through_attribute(unit, scope, expr, _depth)
        if found is not None:
            return found
    if isinstance(expr, cst.Lambda):
        return None
    return _inside(unit, scope, expr, _depth)


def _inside(unit: Unit, scope: Scope, node: cst.CSTNode, depth: int) -> str | None:
    for child in node.children:
        if isinstance(child, cst.BaseExpression):
            found = origin(unit, scope, child, depth, _top=False)
        else:
            found = _inside(unit, scope, child, depth)
        if found is not None:
            return found
    return None


def _through_name(unit: Unit, scope: Scope, name: str, depth: int) -> str | None:
    prog = unit.program
    owner = prog.binding_scope(scope, name)
    if owner is None:
        return None
    for value in owner.assigned.get(name, ()):
        if value is not None:
            found = origin(unit, owner, value, depth + 1)
            if found is not None:
                return found
    return None


def _through_attribute(unit: Unit, scope: Scope, expr: cst.Attribute, depth: int) -> str | None:
    assert isinstance(expr.value, cst.Name)
    if scope.cls is None or not scope.params or expr.value.value != scope.params[0]:
        return None
    info = unit.program.classes.get(scope.cls)
    if info is None:
        return None
    for method, value in info.attr_assigned.get(expr.attr.value, ()):
        if value is not None and method in unit.program.scopes:
            found = origin(unit, unit.program.scopes[method], value, depth + 1)
            if found is not None:
                return found
    return None


def _numeric(call: cst.Call) -> bool:
    return bool(call.args) and isinstance(call.args[0].value, cst.Integer | cst.Float)


def seed_param(unit: Unit, scope: Scope, _depth: int = 0) -> str | None:
    """The parameter a function of the script passes on as a seed (``def set_seed(seed):
    torch.manual_seed(seed)``), directly or through another such function, or None."""
    cache = _SEED_PARAMS.setdefault(unit, {})
    if scope.qualname not in cache:
        cache[scope.qualname] = _seed_param(unit, scope, _depth)
    return cache[scope.qualname]


_SEED_PARAMS: weakref.WeakKeyDictionary[Unit, dict[str, str | None]] = weakref.WeakKeyDictionary()


def _seed_param(unit: Unit, scope: Scope, _depth: int) -> str | None:
    if _depth > _DEPTH or not isinstance(scope.node, cst.FunctionDef):
        return None
    params = set(scope.params)
    calls = [n for n in nodes(unit, scope) if isinstance(n, cst.Call)]
    for call in calls:
        seed: cst.BaseExpression | None = None
        if seeding.seed_taker(unit, call) is not None:
            seed = seeding.seed_argument(call)
        else:
            target = callee(unit, scope, call)
            if target is not None:
                inner = seed_param(target[0], target[1], _depth + 1)
                if inner is not None:
                    seed = bind_params(call, target[1], None).get(inner)
        if seed is not None:
            for n in _names(seed):
                if n in params:
                    return n
    return None


def _names(expr: cst.CSTNode) -> set[str]:
    if isinstance(expr, cst.Name):
        return {expr.value}
    if isinstance(expr, cst.Attribute):
        return _names(expr.value)
    out: set[str] = set()
    for c in expr.children:
        out |= _names(c)
    return out
