"""The check's name resolution against libcst's own ``QualifiedNameProvider``, which it stands in
for: on every call of every fixture, the import paths and builtins both find are the same."""

from __future__ import annotations

from pathlib import Path

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, QualifiedNameProvider, QualifiedNameSource

from flortrain.check.names import resolve_names

#: the real-code fixtures: scripts written elsewhere, the shapes the rules meet
FIXTURES = sorted(str(p) for p in Path("fixtures/realcode").glob("*.py"))

TRICKY = """\
import numpy as np
from torch.utils.data import DataLoader as DL
import os.path
from . import sibling
from .pkg import thing
try:
    from urllib.request import urlretrieve
except ImportError:
    from urllib import urlretrieve

class Net:
    np = None  # a class attribute: not seen by the methods
    def forward(self, x):
        return np.tanh(x)

def helper(x):
    import random
    random.random()
    print = lambda *a: None
    print(x)
    os.path.join(x)
    DL(x).foo()
    open(x).read()
    sibling.f()
    thing()
    urlretrieve(x)
    return set(x)
"""


def _libcst(module: cst.Module) -> dict[cst.Call, set[str]]:
    q = MetadataWrapper(module, unsafe_skip_copy=True).resolve(QualifiedNameProvider)
    out: dict[cst.Call, set[str]] = {}

    class Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            found = q.get(node.func, ())
            if callable(found):
                found = found()
            out[node] = {
                n.name
                for n in found
                if n.source is not QualifiedNameSource.LOCAL and n.name != "builtins.None"
            }

    module.visit(Calls())
    return out


@pytest.mark.parametrize("text", [TRICKY, *FIXTURES], ids=["tricky", *FIXTURES])
def test_same_import_paths_as_libcst(text: str) -> None:
    if text.endswith(".py"):
        text = Path(text).read_text()
    module = cst.parse_module(text)
    names = resolve_names(module)
    compared = 0
    for call, expected in _libcst(module).items():
        if expected:
            compared += 1
            assert names.qualified(call.func) == expected, module.code_for_node(call.func)
    assert compared > 0
