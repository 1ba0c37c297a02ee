"""The script's project modules: the files its imports name, found in one place for every
rule family, and parsed once per check run.

A module is looked up in directories (``aug.py`` or ``aug/__init__.py`` there), never on
``sys.path``: installed libraries are not the project, and nothing is imported or run. Which
directories depends on the question asked:

- :func:`module_path`, for calls followed into ``from aug import augment``: beside the
  importing file, or beside the package it is in; relative imports from its own directory.
- :func:`script_module`, for the execution order: the checked script's directory, as
  ``sys.path[0]`` finds modules, also from inside another project module.
- :func:`hook_module`, for where a training loop lives: the script's directory or one of the
  few above it, as record's import hook takes project modules from the working directory.

Each file is parsed at most once for as long as it is unchanged (:func:`unit_at`), however many
checked files import it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
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


#: directories above the script searched for a package it imports (a repository's ``src/``)
ANCESTORS = 3


def find(dotted: str, dirs: Iterable[str]) -> tuple[str, int] | None:
    """The file of module ``dotted`` in the first of ``dirs`` that has it, and that directory's
    place in ``dirs``; None when none has it."""
    for i, d in enumerate(dirs):
        path = module_file(d, dotted)
        if path is not None:
            return path, i
    return None


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
        dirs: Iterable[str] = [base]
    else:
        dirs = _package_dirs(base)
    found = find(".".join(parts), dirs)
    return found[0] if found is not None else None


def _package_dirs(base: str) -> Iterator[str]:
    """``base``, then each directory above it for as long as the one below is a package."""
    while True:
        yield base
        if not os.path.isfile(os.path.join(base, "__init__.py")):
            return
        base = os.path.dirname(base)


def script_module(unit: Unit, dotted: str) -> Unit | None:
    """The project module ``dotted`` as a unit, when it is a file under the checked script's
    directory (the way ``sys.path[0]`` finds it, also from inside another project module),
    parsed once per content."""
    root = _ROOTS.get(unit) or os.path.dirname(os.path.abspath(unit.path))
    found = find(dotted, [root])
    if found is None or os.path.abspath(found[0]) == os.path.abspath(unit.path):
        return None
    module = unit_at(found[0], unit.config)
    if module is not None:
        _ROOTS[module] = root
    return module


#: the script directory a project module was found from
_ROOTS: weakref.WeakKeyDictionary[Unit, str] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Found:
    path: str
    beside: bool  # under the script's directory: a project module wherever record runs


def hook_module(script: str, dotted: str) -> Found | None:
    """The file ``dotted`` names, beside the script or in a directory above it; None when it
    is neither (an installed package, the standard library, a module made at run time)."""
    found = find(dotted, _ancestors(os.path.dirname(os.path.abspath(script))))
    return Found(found[0], found[1] == 0) if found is not None else None


def _ancestors(here: str) -> Iterator[str]:
    """``here`` and up to :data:`ANCESTORS` directories above it."""
    for _ in range(ANCESTORS + 1):
        yield here
        up = os.path.dirname(here)
        if up == here:
            return
        here = up


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
