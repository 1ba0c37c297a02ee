"""One file in, instrumented code out: the static pass end to end (no torch)."""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from types import CodeType

from flortrain.errors import FlortrainError, Located
from flortrain.static.analysis import analyse, module_prefix
from flortrain.static.linemap import compile_mapped
from flortrain.static.plan import Plan
from flortrain.static.source import Source, parse, read_text
from flortrain.static.transform import Instrumentation, transform


@dataclass(frozen=True)
class Instrumented:
    plan: Plan
    code_text: str


def for_record(source: Source, prefix: str = "") -> Instrumented:
    plan = analyse(source, prefix)
    inst = Instrumentation(
        blocks={b.span.line: b for b in plan.blocks},
        mains={m.span.line: m for m in plan.main_loops},
    )
    return Instrumented(plan, transform(source, inst))


def instrument_file(path: str, text: str | None = None) -> Instrumented:
    return for_record(parse(path, text))


def _loops(text: str, path: str) -> int:
    """How many loops the file has, by the stdlib parser: a quick test before libcst."""
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError):
        return 2  # let the static pass report it, located
    return sum(isinstance(n, ast.For | ast.AsyncFor | ast.While) for n in ast.walk(tree))


def instrument_module(path: str, text: str, module: str) -> Instrumented | None:
    """A project module instrumented with ids prefixed by its dotted name, or None when it has no
    main loop, so it is imported exactly as Python would. A main loop is a loop containing
    another, so a file with fewer than two loops is settled without libcst (most modules: the
    cheap path). Raises :class:`FlortrainError` when the static pass refuses the file."""
    if _loops(text, path) < 2:
        return None
    result = for_record(parse(path, text), module_prefix(module))
    return result if result.plan.main_loops else None


def compile_for(path: str, code_text: str, disk_text: str) -> CodeType:
    """Compile instrumented code so frames point at ``path`` as it is on disk."""
    try:
        code = compile_mapped(code_text, disk_text, path)
    except SyntaxError as e:  # a transform bug must still be one line, not a traceback
        raise FlortrainError(
            f"instrumented code does not compile ({e.msg}); please report this",
            Located(path, e.lineno or 0, e.offset or 0),
            "FT003",
        ) from None
    assert isinstance(code, CodeType)
    return code


def _module_file(root: str, dotted: str) -> str | None:
    """Where ``dotted`` lives under ``root`` as a project module (``a/b.py`` or
    ``a/b/__init__.py``), or None."""
    base = os.path.join(root, *dotted.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def project_imports(script: str, text: str) -> list[tuple[str, str]]:
    """The project modules ``script`` imports directly, as (dotted name, file), in the order of
    its import statements: absolute imports that resolve to files next to the script, the way
    ``sys.path[0]`` resolves them. ``from pkg import mod`` names the submodule when it is one.
    Static and partial on purpose (``flortrain instrument --explain``): the import hook decides
    at run time, for every module actually imported."""
    root = os.path.dirname(os.path.abspath(script))
    try:
        tree = ast.parse(text, filename=script)
    except (SyntaxError, ValueError):
        return []
    names: list[str] = []
    imports = (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
    for node in sorted(imports, key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif node.module and not node.level:
            subs = [f"{node.module}.{a.name}" for a in node.names if _module_file(root, f"{node.module}.{a.name}")]
            names.extend(subs or [node.module])
    out: list[tuple[str, str]] = []
    for name in dict.fromkeys(names):
        path = _module_file(root, name)
        if path is not None:
            out.append((name, os.path.relpath(path)))
    return out


def explain_modules(script: str, text: str) -> list[str]:
    """``--explain`` lines for the project modules the script imports directly: each module's
    plan, as the import hook will apply it (ids prefixed by the module name), or why it is
    imported plainly."""
    found = project_imports(script, text)
    if not found:
        return []
    out = ["project modules are instrumented when imported; those this script imports directly:"]
    for name, path in found:
        try:
            inst = instrument_module(path, read_text(path), name)
        except FlortrainError as e:
            out.append(f"{path}: module {name} imported plainly: {e.one_line()}")
            continue
        if inst is None:
            out.append(f"{path}: module {name}: no main loop; imported plainly")
        else:
            out.append(inst.plan.explain())
    return out
