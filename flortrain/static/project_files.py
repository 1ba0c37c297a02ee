"""Which files are the project's: the modules flortrain instruments, audits and watches.

Project files are ``.py`` files under the script's directory or the working directory, outside
any ``site-packages``/``dist-packages``, the standard library, the running virtualenv and
flortrain itself. The import hook (:mod:`flortrain.runtime.importhook`) instruments them as they
are imported; ``flortrain instrument --explain`` lists them. Nothing here imports libcst or torch.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

#: flortrain's own package directory: never instrumented, whatever the roots
_PKG = str(Path(__file__).resolve().parent.parent)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _excluded_roots() -> list[str]:
    """Where installed and standard code lives. The running virtualenv's prefix counts too (a
    ``.venv`` inside the project is not the project); a system prefix does not, since ``/usr``
    would hold ``/usr/local/src/project``. Each both as given and resolved: modules' ``__file__``
    carry the unresolved form, and a caller that tests a prefix before resolving a path
    (``audit.project_modules``) must find torch's ~1,500 modules there. With only the resolved
    form, a virtualenv reached through a symlink would have every one of them resolved in the
    first audited iteration."""
    paths = sysconfig.get_paths()
    out = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    if sys.prefix != sys.base_prefix:
        out.append(sys.prefix)
    out.append(_PKG)
    return list(dict.fromkeys([*out, *(os.path.realpath(p) for p in out)]))


def project_roots(script: str) -> tuple[str, ...]:
    """The directories whose modules are the project's: the script's and the working one."""
    dirs = (os.path.dirname(os.path.abspath(script)), os.getcwd())
    return tuple(dict.fromkeys(os.path.realpath(d) for d in dirs))


class ProjectFiles:
    """Which files are project modules: under a root, and not installed or standard code."""

    def __init__(self, roots: Sequence[str], script: str) -> None:
        self.roots = tuple(os.path.realpath(r) for r in roots)
        self.excluded = _excluded_roots()
        # the script runs as __main__; imported by its own name it stays plain (its text on
        # replay carries the probes, which a module may not)
        self.script = os.path.realpath(script)
        self._dirs: dict[str, bool] = {}

    def contains(self, path: str) -> bool:
        real = os.path.realpath(path)
        return real.endswith(".py") and real != self.script and self._ours(real)

    def may_hold(self, directories: Sequence[str]) -> bool:
        """Whether a package's ``__path__`` can hold a project module: torch's hundreds of
        submodules are then passed over without a second search of the path."""
        for d in directories:
            if d not in self._dirs:
                self._dirs[d] = self._ours(os.path.realpath(d))
            if self._dirs[d]:
                return True
        return False

    def _ours(self, real: str) -> bool:
        return not self.installed(real) and self.under_roots(real)

    def installed(self, real: str) -> bool:
        """Whether a resolved path is installed or standard code, never the project's."""
        if {"site-packages", "dist-packages"} & set(Path(real).parts):
            return True
        return any(_under(real, x) for x in self.excluded)

    def under_roots(self, real: str) -> bool:
        return any(_under(real, r) for r in self.roots)
