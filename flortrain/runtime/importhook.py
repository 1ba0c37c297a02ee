"""Instrument the project's own modules as they are imported.

Only the script given on the command line is transformed up front, but training code often lives
in a module it imports (minGPT: ``from mingpt.trainer import Trainer``, whose ``run()`` holds the
epoch loop). :class:`ProjectHook` sits on ``sys.meta_path``, just before the standard path finder,
while the script runs. For a module the standard path finder locates in a ``.py`` file of the
project, it hands the import system a loader whose code is the instrumented module, compiled with
the file's own name and line numbers. Everything else about the import (spec, ``__file__``, ``__path__``, ``__cached__``,
relative imports, one module per name in ``sys.modules``) is what the standard machinery does,
because the spec is the standard one with only its loader replaced.

Which files are the project's is :mod:`flortrain.static.project_files`'s to say. A module with no main loop keeps the standard loader (the cheap path), and so
does one the static pass refuses (with one warning line).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from importlib.machinery import ModuleSpec
from types import CodeType, ModuleType

from flortrain.errors import FlortrainError, Located
from flortrain.static.linemap import compile_for
from flortrain.static.plan import Instrumented, ModulePasses, Plan
from flortrain.static.project_files import ProjectFiles
from flortrain.static.text import loop_count, read_text

#: Called for each module instrumented: (dotted name, file, text on disk, plan)
OnModule = Callable[[str, str, str, Plan], None]


class InstrumentedLoader(importlib.machinery.SourceFileLoader):
    """The standard source loader with the instrumented code in place of the compiled file.
    Nothing is written to ``__pycache__``: the cached bytecode stays that of the plain file."""

    def __init__(self, fullname: str, path: str, code: CodeType) -> None:
        super().__init__(fullname, path)
        self._code = code

    def get_code(self, fullname: str) -> CodeType:
        return self._code


def _warn(e: FlortrainError, name: str) -> None:
    print(
        f"flortrain: warning: {e.one_line()}; module {name} imported without instrumentation",
        file=sys.stderr,
    )


class ProjectHook(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` finder that instruments project modules with main loops.

    Record instruments every project module it finds with a main loop and reports each through
    ``on_module``. Replay passes ``recorded`` (file -> text the record instrumented) and
    instruments exactly those files, so a replay runs the modules with the plan they were
    recorded with; any other module is imported plainly, as it was on record."""

    def __init__(
        self,
        files: ProjectFiles,
        on_module: OnModule | None = None,
        recorded: Mapping[str, str] | None = None,
        prepared: ModulePasses | None = None,
    ) -> None:
        self.files = files
        self.on_module = on_module
        self.recorded = recorded
        self.prepared = prepared or {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if (
            fullname == "flortrain"
            or fullname.startswith("flortrain.")
            or (path is not None and not self.files.may_hold(path))
        ):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if (
            spec is None
            or spec.origin is None
            or type(spec.loader) is not importlib.machinery.SourceFileLoader
            or not self.files.contains(spec.origin)
        ):
            return None  # not ours: the rest of sys.meta_path finds it as usual
        code = self._code(fullname, spec.origin)
        if code is None:
            return None
        spec.loader = InstrumentedLoader(fullname, spec.origin, code)
        return spec

    def _code(self, name: str, origin: str) -> CodeType | None:
        """The module's instrumented code, or None to import it plainly. Frames name ``origin``,
        as under python; the store knows the file by its absolute path."""
        path = os.path.abspath(origin)
        if self.recorded is not None and path not in self.recorded:
            return None
        try:
            text = read_text(path)
            if self.recorded is not None and text != self.recorded[path]:
                # checked before the replay started; changed since: run it plainly (slow, exact)
                raise FlortrainError("changed during the replay", Located(path), "FT032")
            inst = self._instrumented(path, text, name)
            if inst is None:
                return None
            code = compile_for(origin, inst.code_text, text)
        except FlortrainError as e:
            _warn(e, name)
            return None
        if self.on_module is not None:
            self.on_module(name, path, text, inst.plan)
        return code

    def _instrumented(self, path: str, text: str, name: str) -> Instrumented | None:
        """The module instrumented, None for a plain import; raises the pass's refusal. A pass
        done ahead (:class:`ModulePass`, by the static pass's child) is used if the file is
        still what it read; otherwise the pass runs here."""
        pre = self.prepared.get((path, name))
        if pre is not None and pre.text == text:
            if pre.error is not None:
                raise pre.error
            return pre.result
        if loop_count(text, path) < 2:
            return None  # no main loop possible: imported plainly, libcst never imported
        # libcst is imported only for a module that may need it
        from flortrain.instrument import instrument_module

        return instrument_module(path, text, name)


@contextmanager
def installed(hook: importlib.abc.MetaPathFinder | None) -> Iterator[None]:
    """``hook`` on ``sys.meta_path`` for the block, just before the standard path finder: the
    finders ahead of it (built-in and frozen modules, any the user installed) keep precedence, so
    a project file named ``time.py`` is no more imported for ``import time`` than under python.
    Removed afterwards (a record run inside a test process leaves nothing behind)."""
    if hook is None:
        yield
        return
    finders = sys.meta_path
    at = next(
        (i for i, f in enumerate(finders) if f is importlib.machinery.PathFinder), len(finders)
    )
    finders.insert(at, hook)
    try:
        yield
    finally:
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)
