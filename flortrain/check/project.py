"""The script's project modules: files beside it that it imports, parsed once per check run.

Interprocedural rules follow a call into ``from aug import augment`` as they follow a call to a
function of the file itself. A module is looked up beside the importing file (``aug.py`` or
``aug/__init__.py``), never on ``sys.path``: installed libraries are not the project, and nothing
is imported or run. Each file is parsed at most once for as long as it is unchanged, however
many checked files import it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import libcst as cst

from flortrain.check.config import CheckConfig
from flortrain.check.unit import Unit
from flortrain.errors import FlortrainError
from flortrain.static.program import MODULE, ClassInfo, Scope
from flortrain.static.source import parse
from flortrain.static.text import module_file

#: (absolute path, mtime, size) -> the module's unit, or None when it does not parse
_CACHE: dict[tuple[str, int, int], Unit | None] = {}


def module_path(importer: Unit, dotted: str) -> str | None:
    """The file of project module ``dotted`` (``aug``, ``pkg.aug``, relative ``..utils``) as
    seen from ``importer``: beside it, or, when it is inside a package, beside that package
    (``from pcdet.utils import x`` in ``pcdet/datasets/__init__.py``). None: not in the
    project."""
    base = os.path.dirname(os.path.abspath(importer.path))
    dots = len(dotted) - len(dotted.lstrip("."))
    parts = [p for p in dotted[dots:].split(".") if p]
    if not parts:
        return None
    if dots:
        for _ in range(dots - 1):  # `from ..utils import x`: one directory up per extra dot
            base = os.path.dirname(base)
        return module_file(base, ".".join(parts))
    while True:
        found = module_file(base, ".".join(parts))
        if found is not None or not os.path.isfile(os.path.join(base, "__init__.py")):
            return found
        base = os.path.dirname(base)


def load(importer: Unit, dotted: str) -> Unit | None:
    """Project module ``dotted``'s unit, parsed on first use (None: no such file, or it does
    not parse; the module's own check reports why)."""
    path = module_path(importer, dotted)
    if path is None or os.path.abspath(importer.path) == path:
        return None
    return unit_at(path, importer.config)


def unit_at(path: str, config: CheckConfig) -> Unit | None:
    """The unit of the project file ``path``, parsed once for as long as it is unchanged (None:
    it is gone or does not parse). Every rule family that follows calls into project modules
    reads them through this one cache."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (os.path.abspath(path), st.st_mtime_ns, st.st_size)
    if key not in _CACHE:
        try:
            _CACHE[key] = Unit(parse(path), config)
        except FlortrainError:
            _CACHE[key] = None
    return _CACHE[key]


@dataclass(frozen=True)
class Def:
    """What a name stands for: a function (``scope``) or a class (``cls``) of ``unit``."""

    unit: Unit
    scope: Scope | None = None
    cls: ClassInfo | None = None


def resolve_dotted(unit: Unit, dotted: str, depth: int = 0) -> Def | None:
    """A module-level function or class by its qualified name as ``unit`` sees it: its own
    (``augment``, ``Aug``) or a project module's (``aug.augment``), following re-exports a few
    modules deep."""
    prog = unit.program
    if dotted in prog.classes:
        return Def(unit, cls=prog.classes[dotted])
    if dotted in prog.scopes and dotted != MODULE:
        return Def(unit, scope=prog.scopes[dotted])
    if depth > 3 or "." not in dotted:
        origin = prog.import_origin(dotted) if depth <= 3 else None
        if origin is None or origin == dotted:
            return None
        return resolve_dotted(unit, origin, depth + 1)
    head, name = dotted.rsplit(".", 1)
    origin = prog.import_origin(head.split(".")[0])
    if origin is not None and origin != head.split(".")[0]:
        head = origin + head[len(head.split(".")[0]) :]
    module = load(unit, head)
    if module is None:
        return None
    return resolve_dotted(module, name, depth + 1)


def module_global(
    unit: Unit, name: str, depth: int = 0
) -> tuple[Unit, list[cst.BaseExpression | None]]:
    """The values bound to module-level ``name``, in the module that binds it (an imported
    name is looked up in its project module)."""
    prog = unit.program
    origin = prog.import_origin(name)
    if origin is not None and "." in origin and depth < 3:
        head, attr = origin.rsplit(".", 1)
        module = load(unit, head)
        if module is not None:
            return module_global(module, attr, depth + 1)
    return unit, prog.scopes[MODULE].assigned.get(name, [])
