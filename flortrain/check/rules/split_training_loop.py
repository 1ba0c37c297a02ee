"""A training loop split across files, or held where record's import hook does not look."""

from __future__ import annotations

import os
from collections.abc import Iterator

import libcst as cst

from flortrain.check import modules, plan_facts, project
from flortrain.check.finding import Severity
from flortrain.check.rule import Family, Hit, Invalid, Rule, Valid
from flortrain.check.unit import Unit
from flortrain.static.expressions import dotted
from flortrain.static.loops import loop_body
from flortrain.static.program import Program

_TRAINER = (
    "def train_one_epoch(model, loader, opt):\n"
    "    for x, y in loader:\n"
    "        opt.zero_grad()\n"
    "        model(x).sum().backward()\n"
    "        opt.step()\n"
)
_FIT = (
    "def fit(model, loader, opt):\n"
    "    for epoch in range(3):\n"
    "        for x, y in loader:\n"
    "            model(x).sum().backward()\n"
    "            opt.step()\n"
)


class SplitTrainingLoop(Rule):
    code = f"{Family.REPLAY}007"
    name = "split-training-loop"
    severity = Severity.WARNING
    message = "the training loop is split across files: nothing is memoized"
    hint = "keep the epoch loop and the batch loop it runs in one file (a function holding both)"
    doc = (
        "The static pass sees one file at a time, and a main loop is a loop that contains"
        " another. An epoch loop in the script whose body calls `train_one_epoch()` from another"
        " module has no inner loop the pass can see, and the module's batch loop has no outer"
        " one: neither is a main loop, and nothing is memoized (record's import hook imports a"
        " module with fewer than two loops plainly; in one with more, a loop whose body is the"
        " training step is a main loop of its own, and is not reported). A module that holds a whole"
        " training nest (minGPT's `Trainer.run()`) is instrumented when imported, if it is a"
        " project module: a file under the script's directory or the working directory. One in a"
        " directory above the script (a repository's package imported from `scripts/train.py`)"
        " is instrumented only when record runs from a directory above it, which the static pass"
        " cannot know. Imports are followed to files beside the script and up to three"
        " directories above it; installed packages (a library's `Trainer.fit()`) are not read,"
        " and their loops are never memoized."
    )
    valid = (
        Valid(
            """
            from engine import fit
            fit(model, loader, opt)
            """,
            files=(("engine.py", _FIT),),
        ),
        # two loops in the module: the hook analyses it, and the batch loop, whose body is the
        # training step, is a main loop of its own there
        Valid(
            """
            from engine import train_one_epoch
            for epoch in range(3):
                train_one_epoch(model, loader, opt)
            """,
            files=(
                (
                    "engine.py",
                    _TRAINER
                    + "def evaluate(model, loader):\n    for x in loader:\n        model(x)\n",
                ),
            ),
        ),
        Valid(
            """
            import json
            for epoch in range(3):
                json.dumps(epoch)
            """
        ),
    )
    invalid = (
        Invalid(
            """
            from engine import train_one_epoch
            for epoch in range(3):
                train_one_epoch(model, loader, opt)
            """,
            line=3,
            col=5,
            files=(("engine.py", _TRAINER),),
        ),
        Invalid(
            """
            import engine
            def main():
                for epoch in range(3):
                    engine.train_one_epoch(model, loader, opt)
            """,
            line=4,
            col=9,
            files=(("engine.py", _TRAINER),),
        ),
    )

    def check(self, unit: Unit) -> Iterator[Hit]:
        p = plan_facts.plan(unit)
        prog = plan_facts.program(unit)
        if p is None or prog is None or not prog.import_origins:
            return
        yield from _outside_directory(unit, prog)
        if plan_facts.training_mains(p):
            return
        for scope in prog.scopes.values():
            for loop in scope.loops:
                if prog.loop_parent.get(loop) is not None or loop in prog.class_body_loops:
                    continue
                for call in prog.calls_in(list(loop_body(loop))):
                    where = _imported_trainer(unit, prog, call)
                    if where is not None:
                        yield Hit(
                            call,
                            message=(
                                f"the loop calls `{dotted(call.func)}()` from {where}, whose loop"
                                " trains: a training loop split across files is not a main loop"
                                " (the static pass sees one file at a time), so nothing is memoized"
                            ),
                        )
                        break


def _imported_trainer(unit: Unit, prog: Program, call: cst.Call) -> str | None:
    """Where the function ``call`` runs lives, when it is another file's training loop that
    is not a main loop of its own."""
    name = dotted(call.func)
    if name is None:
        return None
    head, _, rest = name.partition(".")
    origin = prog.import_origin(head)
    if origin is None:
        return None
    full = f"{origin}.{rest}" if rest else origin
    module, _, func = full.rpartition(".")
    if not module:
        return None
    found = project.hook_module(unit.path, module)
    if found is None or not modules.function_loops(found.path).get(func):
        return None
    if func in modules.main_loop_functions(found.path, module):
        return None  # a main loop of its own: the import hook memoizes it
    return os.path.relpath(found.path)


def _outside_directory(unit: Unit, prog: Program) -> Iterator[Hit]:
    """Imports of a module above the script's directory that holds a training main loop."""
    for node in unit.module.body:
        stmts = node.body if isinstance(node, cst.SimpleStatementLine) else ()
        for s in stmts:
            if not isinstance(s, cst.Import | cst.ImportFrom):
                continue
            for dotted_name in _imported_modules(unit.path, s):
                found = project.hook_module(unit.path, dotted_name)
                if found is None or found.beside:
                    continue
                if not modules.main_loop_functions(found.path, dotted_name):
                    continue
                yield Hit(
                    s,
                    message=(
                        f"`{dotted_name}` ({os.path.relpath(found.path)}) holds a training main"
                        " loop outside the script's directory: record instruments it only when"
                        " run from a directory above it (project modules are files under the"
                        " script's or the working directory)"
                    ),
                )
                break


def _imported_modules(script: str, s: cst.Import | cst.ImportFrom) -> Iterator[str]:
    if isinstance(s, cst.Import):
        for alias in s.names:
            name = dotted(alias.name)
            if name is not None:
                yield name
    elif s.module is not None and not s.relative:
        base = dotted(s.module)
        if base is None:
            return
        if not isinstance(s.names, cst.ImportStar):
            for alias in s.names:
                sub = dotted(alias.name)
                if sub is not None and project.hook_module(script, f"{base}.{sub}") is not None:
                    yield f"{base}.{sub}"
        yield base
