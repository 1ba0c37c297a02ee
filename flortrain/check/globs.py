"""Glob patterns as ruff and gitignore write them (``**/``, ``*``, ``?``, ``[...]``), for excludes
and per-file-ignores. A pattern with a ``/`` matches a path relative to the configuration's
directory; one without matches the file's or directory's own name (``build`` is every ``build/``
the walk meets, ``__init__.py`` every such file), as ruff matches them."""

from __future__ import annotations

import re
from functools import cache


@cache
def _regex(pattern: str) -> re.Pattern[str]:
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            j = pattern.find("]", i + 1)
            if j < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1 : j]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")


def matches(pattern: str, relpath: str) -> bool:
    """Whether ``pattern`` covers ``relpath`` (``/``-separated, relative to the config's root)."""
    pattern = pattern.removeprefix("./").rstrip("/")
    if "/" in pattern:
        return _regex(pattern).match(relpath) is not None
    return _regex(pattern).match(relpath.rsplit("/", 1)[-1]) is not None
