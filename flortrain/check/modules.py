"""What the files a script's imports lead to train, read with the stdlib parser (the files
themselves are found by :func:`flortrain.check.project.hook_module`).

The static pass sees one file at a time; record's import hook instruments the project modules
(files under the script's directory or the working directory) when they are imported. To say
before training that a training loop is split across files, or lives where the hook will not
take it, the checker reads those files as the hook would: its own shortcut first (a file with
fewer than two loops is imported plainly), then the static pass, once per file.
"""

from __future__ import annotations

import ast
from functools import lru_cache

from flortrain.check.plan_facts import trains
from flortrain.errors import FlortrainError
from flortrain.static.analysis import analyse, module_prefix
from flortrain.static.plan import Plan
from flortrain.static.source import parse
from flortrain.static.text import loop_count, read_text


@lru_cache(maxsize=64)
def module_plan(path: str, dotted: str) -> Plan | None:
    """The plan record's import hook would apply to the module at ``path`` imported as
    ``dotted``; None when it imports the module plainly (fewer than two loops, no main loop,
    or a file the pass refuses)."""
    try:
        text = read_text(path)
        if loop_count(text, path) < 2:  # the hook's own shortcut: imported plainly
            return None
        plan = analyse(parse(path, text), module_prefix(dotted))
    except (FlortrainError, RecursionError):
        return None
    return plan if plan.main_loops else None


def main_loop_functions(path: str, dotted: str) -> set[str]:
    """The functions of the module that hold one of its training main loops."""
    plan = module_plan(path, dotted)
    if plan is None:
        return set()
    return {m.function for m in plan.main_loops if trains(m)}


def function_loops(path: str) -> dict[str, bool]:
    """Each function of the file (``f``, ``Trainer.run``) that has a loop, and whether it calls
    ``backward()`` or an optimizer ``step()``: read with :mod:`ast`, without libcst."""
    try:
        tree = ast.parse(read_text(path), filename=path)
    except (FlortrainError, SyntaxError, ValueError, RecursionError):
        return {}
    out: dict[str, bool] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                nodes = list(ast.walk(node))
                if any(isinstance(n, ast.For | ast.While | ast.AsyncFor) for n in nodes):
                    out[prefix + node.name] = any(_trains(n) for n in nodes)

    visit(tree.body, "")
    return out


def _trains(n: ast.AST) -> bool:
    return (
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and (
            n.func.attr == "backward"
            or (n.func.attr == "step" and "sched" not in ast.unparse(n.func.value).lower())
        )
    )
