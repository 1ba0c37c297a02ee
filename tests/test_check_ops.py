"""The op lists DET001/DET002 read: chosen by the configured torch release, and faithful to the
docstring of ``torch.use_deterministic_algorithms`` of the torch installed (read as text from
its source file; torch is never imported)."""

from __future__ import annotations

import importlib.util
import json
import re
from importlib import resources
from pathlib import Path

import pytest

from flortrain.check.config import CheckConfig
from flortrain.check.runner import check_text

KTH = (
    "import torch\ntorch.use_deterministic_algorithms(True)\nv = torch.kthvalue(torch.ones(3), 1)\n"
)


@pytest.mark.parametrize(
    ("version", "raises"),
    [("2.13", False), ("2.14", False), ("2.4", True), ("2.12", True), ("1.13", True)],
)
def test_the_list_follows_the_configured_torch(version: str, raises: bool) -> None:
    """kthvalue on CUDA raised under deterministic mode up to the older list, not in 2.13's;
    a release between two lists takes the older, one before every list the oldest."""
    found = check_text("train.py", KTH, CheckConfig(select=("DET002",), torch_version=version))
    assert [f.line for f in found] == ([3] if raises else [])


def _data(version: str) -> dict:  # type: ignore[type-arg]
    text = resources.files("flortrain.check").joinpath("data", f"torch-{version}.json")
    return json.loads(text.read_text())  # type: ignore[no-any-return]


def test_every_entry_is_spelled() -> None:
    for version in ("2.4", "2.13"):
        data = _data(version)
        assert data["torch"] == version
        for op in data["ops"]:
            assert op["list"] in ("deterministic", "raises") and op["device"] in (
                "cuda",
                "cpu",
                "any",
            )
            assert op["spelled"], op["op"]
            for s in op["spelled"]:
                assert s["kind"] in ("module", "function", "method")
                assert s["kind"] == "method" or s["name"].startswith("torch."), s


def _documented(source: str) -> tuple[set[str], set[str]]:
    doc = source[source.index("def use_deterministic_algorithms(") :]
    doc = doc[: doc.index("In addition")]
    _, fixed, raises = doc.split("The following normally-nondeterministic operations")
    names = re.compile(r":(?:class|func):`(torch\.[^`]+)`")
    return set(names.findall(fixed)), set(names.findall(raises))


def test_the_2_13_list_is_torch_2_13s_own() -> None:
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None, "torch is installed with the dev tools"
    source = Path(spec.origin).read_text()
    version = Path(spec.origin).parent.joinpath("version.py").read_text()
    if "__version__ = '2.13." not in version and '__version__ = "2.13.' not in version:
        pytest.skip("the installed torch is not 2.13")
    fixed, raises = _documented(source)
    data = _data("2.13")
    unspelled = {n.split()[0] for n in data["not_spelled"]}
    ours = {
        kind: {op["op"].split()[0] for op in data["ops"] if op["list"] == kind}
        for kind in ("deterministic", "raises")
    }
    assert ours["deterministic"] == fixed - unspelled
    assert ours["raises"] == raises - unspelled
