"""One file in, instrumented code out: the static pass end to end (no torch)."""

from __future__ import annotations

import os

from flortrain.errors import FlortrainError
from flortrain.static.analysis import analyse, module_prefix
from flortrain.static.plan import Instrumentation, Instrumented
from flortrain.static.project_files import ProjectFiles, project_roots
from flortrain.static.source import Source, parse
from flortrain.static.text import loop_count, path_imports, project_imports, read_text
from flortrain.static.transform import transform


def for_record(source: Source, prefix: str = "") -> Instrumented:
    plan = analyse(source, prefix)
    inst = Instrumentation(
        blocks={b.span.line: b for b in plan.blocks},
        mains={m.span.line: m for m in plan.main_loops},
        forward={f.line: (m.id, f) for m in plan.main_loops for f in m.fast_forward},
    )
    return Instrumented(plan, transform(source, inst))


def instrument_file(path: str, text: str | None = None) -> Instrumented:
    return for_record(parse(path, text))


def instrument_module(path: str, text: str, module: str) -> Instrumented | None:
    """A project module instrumented with ids prefixed by its dotted name, or None when it has no
    main loop, so it is imported exactly as Python would. A main loop is a loop containing
    another, so a file with fewer than two loops is settled without libcst (most modules: the
    cheap path). Raises :class:`FlortrainError` when the static pass refuses the file."""
    if loop_count(text, path) < 2:
        return None
    result = for_record(parse(path, text), module_prefix(module))
    return result if result.plan.main_loops else None


def explain_modules(script: str, text: str) -> list[str]:
    """``--explain`` lines for the project modules the script imports directly: each module's
    plan, as the import hook will apply it (ids prefixed by the module name), or why it is
    imported plainly; then the modules it imports from a ``sys.path`` directory outside the
    project, which are not instrumented (:func:`outside_lines`)."""
    found = project_imports(script, text)
    outside = outside_lines(script, text, found)
    if not found:
        return outside
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
    return out + outside


def outside_lines(script: str, text: str, found: list[tuple[str, str]]) -> list[str]:
    """Why a module the script imports from source on ``sys.path`` outside the project (an
    editable install's tree, a ``PYTHONPATH`` entry: minGPT's ``mingpt`` imported from the
    repository's root by a script in ``projects/chargpt``) has none of its loops memoized: the
    import hook instruments only the project's files, those under the script's directory or
    the working directory. Installed packages (``site-packages``) are not listed; one under the
    working directory is the project's, and joins ``found``."""
    files = ProjectFiles(project_roots(script), script)
    out = []
    for name, path, where in path_imports(script, text):
        real = os.path.realpath(path)
        if files.installed(real):
            continue
        if files.under_roots(real):
            found.append((name, os.path.relpath(path)))
            continue
        out.append(
            f"{path}: module {name} is imported from {where}, outside the project (the script's"
            " directory and the working directory): not instrumented, so none of its loops is"
            f" memoized; modules under the working directory are the project's (run from {where})"
        )
    return out
