"""A script's text, and the facts read off it without libcst.

This is the side of the static pass a run needs before it knows whether to pay for libcst: the
text as Python decodes it, how many loops a file has, which project modules a script imports.
It imports nothing heavy, so ``flortrain record`` can read the script, decide, and fork the
analyses off (:mod:`flortrain.process.static_child`) before libcst or torch is imported.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import os
import tokenize
from pathlib import Path

from flortrain.errors import FlortrainError, Located


def read_text(path: str) -> str:
    """The script's text as Python decodes it: a UTF-8 BOM or a PEP 263 coding cookie is honoured
    (``compile`` rejects a str that still starts with a BOM; a latin-1 script is valid Python)."""
    p = Path(path)
    if p.is_dir():
        raise FlortrainError("is a directory, not a script", Located(path), "FT001")
    if not p.is_file():
        raise FlortrainError("no such file", Located(path), "FT001")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise FlortrainError(f"cannot read: {e.strerror}", Located(path), "FT001") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as e:  # an unknown or contradictory coding cookie
        raise FlortrainError(f"cannot decode: {e.msg}", Located(path), "FT001") from None
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        what = "UTF-8" if encoding.startswith("utf-8") else encoding
        raise FlortrainError(f"not {what} text ({e.reason})", Located(path), "FT001") from None


def loop_count(text: str, path: str) -> int:
    """How many loops the file has, by the stdlib parser: a quick test before libcst."""
    try:
        tree = ast.parse(text, filename=path)
    except (SyntaxError, ValueError):
        return 2  # let the static pass report it, located
    return sum(isinstance(n, ast.For | ast.AsyncFor | ast.While) for n in ast.walk(tree))


def module_file(root: str, dotted: str) -> str | None:
    """Where ``dotted`` lives under ``root`` as a project module (``a/b.py`` or
    ``a/b/__init__.py``), or None."""
    base = os.path.join(root, *dotted.split("."))
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _imported_names(script: str, text: str) -> list[str]:
    """The modules the script's absolute imports name, in the order of its import statements;
    ``from pkg import mod`` names the submodule when it is a file next to the script."""
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
            subs = [
                f"{node.module}.{a.name}"
                for a in node.names
                if module_file(root, f"{node.module}.{a.name}")
            ]
            names.extend(subs or [node.module])
    return list(dict.fromkeys(names))


def project_imports(script: str, text: str) -> list[tuple[str, str]]:
    """The project modules ``script`` imports directly, as (dotted name, file), in the order of
    its import statements: absolute imports that resolve to files next to the script, the way
    ``sys.path[0]`` resolves them. ``from pkg import mod`` names the submodule when it is one.
    Static and partial on purpose (``flortrain instrument --explain``): the import hook decides
    at run time, for every module actually imported."""
    root = os.path.dirname(os.path.abspath(script))
    out: list[tuple[str, str]] = []
    for name in _imported_names(script, text):
        path = module_file(root, name)
        if path is not None:
            out.append((name, os.path.relpath(path)))
    return out


def path_imports(script: str, text: str) -> list[tuple[str, str, str]]:
    """The modules ``script`` imports directly that are not next to it but found as source on
    ``sys.path``, as (dotted name, file, the ``sys.path`` directory holding it): installed
    packages, an editable install's source tree or a ``PYTHONPATH`` entry alike (which of them
    are the project's is the import hook's rule). Located without importing anything: the
    top-level name's spec, then the dotted name's file under its directory."""
    root = os.path.dirname(os.path.abspath(script))
    out: list[tuple[str, str, str]] = []
    for name in _imported_names(script, text):
        if module_file(root, name) is not None:
            continue
        try:
            spec = importlib.util.find_spec(name.partition(".")[0])
        except (ImportError, ValueError):
            continue
        if spec is None or not spec.has_location or spec.origin is None:
            continue
        if not spec.origin.endswith(".py"):
            continue
        top = os.path.dirname(spec.origin)
        where = os.path.dirname(top) if spec.submodule_search_locations is not None else top
        path = module_file(where, name) or spec.origin
        if (name, path, where) not in out:
            out.append((name, path, where))
    return out


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def uses_torch(source: str) -> bool:
    """Whether a script needs the torch side of the runtime (registry, thread pinning). A textual
    test on purpose: importing torch costs seconds, and a script that never names torch has no
    modules or optimizers to register."""
    return "torch" in source


def project_uses_torch(script: str, text: str) -> bool:
    """:func:`uses_torch` for the script or a project module it imports directly: minGPT's
    ``train.py`` may leave every torch call to ``mingpt/trainer.py``."""
    if uses_torch(text):
        return True
    for _, path in project_imports(script, text):
        with contextlib.suppress(OSError):
            if uses_torch(Path(path).read_text(errors="replace")):
                return True
    return False
