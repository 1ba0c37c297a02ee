"""The framework's parts that rule cases cannot express: how ``# noqa`` comments are read, glob
matching, ruff's layered rule selection, and a fix engine that never writes a file that no
longer parses and always terminates (exercised with rules defined here, for the test only)."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
import pytest

from flortrain.check.config import CheckConfig, Selection
from flortrain.check.finding import Edit, Fix, Severity
from flortrain.check.fix import fix_text
from flortrain.check.formats.concise import summary
from flortrain.check.globs import matches
from flortrain.check.noqa import Suppressions, parse_comment
from flortrain.check.report import Report
from flortrain.check.rule import Hit, Rule
from flortrain.check.runner import check_text
from flortrain.check.unit import Unit


@pytest.mark.parametrize(
    ("comment", "codes"),
    [
        ("# noqa", None),
        ("#noqa", None),
        ("# NOQA", None),
        ("# NoQA because reasons", None),
        ("#noqa:RNG001", {"RNG001"}),
        ("# noqa: RNG001,DET101", {"RNG001", "DET101"}),
        ("# noqa : RNG001 DET101", {"RNG001", "DET101"}),
        ("# noqa: RNG001, DET101 seeded upstream", {"RNG001", "DET101"}),
        ("# type: ignore[attr-defined]  # noqa: RNG001", {"RNG001"}),
        ("# noqa:E501 # pylint: disable=x", {"E501"}),
    ],
)
def test_noqa_directives(comment: str, codes: set[str] | None) -> None:
    d = parse_comment(comment)
    assert d is not None and d.codes == (None if codes is None else frozenset(codes))


@pytest.mark.parametrize("comment", ["# noqa:", "# noqa: rng001", "# noqanything", "# a comment"])
def test_not_noqa_directives(comment: str) -> None:
    assert parse_comment(comment) is None


def test_noqa_in_multiline_strings_and_continuations() -> None:
    text = (
        'doc = """first\n'  # 1: a string running to line 3
        "second\n"  # 2
        '"""  # noqa: DET101\n'  # 3
        "x = f'''a\n"  # 4: an f-string to line 5
        "{1}'''  # noqa\n"  # 5
        "y = 1 + \\\n"  # 6: continued on 7
        "    2  # noqa: RNG002\n"  # 7
        "z = '# noqa'\n"  # 8: in a string, not a comment
    )
    s = Suppressions(text)
    assert [ln for ln in range(1, 9) if s.covers(ln, "DET101")] == [1, 2, 3, 4, 5]
    assert [ln for ln in range(1, 9) if s.covers(ln, "RNG002")] == [4, 5, 6, 7]


@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("build", "build", True),
        ("build", "src/build", True),  # a name matches at any depth
        ("*.egg-info", "x/flortrain.egg-info", True),
        ("tests/*", "tests/test_a.py", True),
        ("tests/*", "src/tests/test_a.py", False),  # a path is relative to the root
        ("**/tests/*.py", "src/tests/a.py", True),
        ("**/tests/*.py", "tests/a.py", True),
        ("legacy/**", "legacy/a/b.py", True),
        ("gen/*.py", "gen/sub/a.py", False),
        ("train_?.py", "train_1.py", True),
        ("[!a]*.py", "b.py", True),
        ("./vendor", "vendor", True),
    ],
)
def test_globs(pattern: str, path: str, hit: bool) -> None:
    assert matches(pattern, path) is hit


def test_selection_layers_as_ruff() -> None:
    """ruff's resolution: the most specific prefix wins within a layer, ``ignore`` on a tie; a
    later layer's select replaces the selection, its ignore and extend-select adjust it."""
    c = CheckConfig(select=("DET",), ignore=("DET101",))
    assert c.enabled("DET001") and not c.enabled("DET101") and not c.enabled("RNG001")
    c = CheckConfig(select=("DET101",), ignore=("DET",))
    assert c.enabled("DET101") and not c.enabled("DET001")
    c = CheckConfig(select=("DET1",), ignore=("DET1",))
    assert not c.enabled("DET101")
    assert CheckConfig(ignore=("ALL",), extend_select=("RNG",)).enabled("RNG002")
    assert not CheckConfig(select=()).enabled("RNG002")  # `select = []` selects nothing
    base = CheckConfig(select=("RNG",), ignore=("RNG002",))
    cli = CheckConfig(select=base.select, ignore=base.ignore, overrides=(Selection(("RNG002",)),))
    assert cli.enabled("RNG002") and not cli.enabled("RNG001")
    ext = CheckConfig(
        select=base.select, ignore=base.ignore, overrides=(Selection(None, ("DET",)),)
    )
    assert ext.enabled("DET101") and ext.enabled("RNG001") and not ext.enabled("RNG002")


def test_severity_override_most_specific() -> None:
    c = CheckConfig(severity={"DET": "error", "DET101": "warning"})
    assert c.severity_of("DET101") == "warning" and c.severity_of("DET004") == "error"
    assert c.severity_of("RNG001") is None


class _Names(Rule):
    """Test-only: reports every name ``a``; its fix is whatever the subclass edits in."""

    code = "TST001"
    name = "test-names"
    severity = Severity.ERROR
    message = "a name a"
    hint = "rename it"
    replacement = "b"

    def check(self, unit: Unit) -> Iterator[Hit]:
        found: list[cst.Name] = []

        class _V(cst.CSTVisitor):
            def visit_Name(self, node: cst.Name) -> None:
                if node.value == "a":
                    found.append(node)

        unit.module.visit(_V())
        for node in found:
            start, end = unit.span(node)
            yield Hit(node, fix=Fix((Edit(start, end, self.replacement),)))


class _Unsafe(_Names):
    """Its fix may change a correct program's meaning: only ``--unsafe-fixes`` applies it."""

    code = "TST005"

    def check(self, unit: Unit) -> Iterator[Hit]:
        for hit in super().check(unit):
            assert hit.fix is not None
            yield Hit(hit.node, fix=Fix(hit.fix.edits, safe=False))


class _Breaks(_Names):
    """Its fix leaves the file unparsable."""

    code = "TST002"
    replacement = "(("


class _Keeps(_Names):
    """Its fix changes the text but never removes the finding (``a`` -> ``a + 0``...)."""

    code = "TST003"
    replacement = "(a)"


def _fix(text: str, rule: type[Rule], unsafe: bool = False) -> tuple[str, int, bool, list[str]]:
    config = CheckConfig()
    found = check_text("t.py", text, config, rules=[rule])
    r = fix_text(text, found, lambda t: check_text("t.py", t, config, rules=[rule]), unsafe)
    return r.text, r.fixed, r.converged, [f.code for f in r.findings]


def test_fix_rounds_apply_every_fix() -> None:
    assert _fix("a = 1\nprint(a, a)\n", _Names) == ("b = 1\nprint(b, b)\n", 3, True, [])


def test_unsafe_fixes_only_when_asked() -> None:
    text = "a = 1\n"
    assert _fix(text, _Unsafe) == (text, 0, True, ["TST005"])
    assert _fix(text, _Unsafe, unsafe=True) == ("b = 1\n", 1, True, [])
    found = check_text("t.py", text, CheckConfig(), rules=[_Unsafe])
    assert (
        summary(Report(found))
        == "Found 1 error and 0 warnings. (1 more with --fix --unsafe-fixes.)"
    )
    assert summary(Report(found, unsafe_fixes=True)).endswith("[*] 1 fixable with --fix.")


def test_a_fix_that_breaks_the_parse_is_never_taken() -> None:
    text = "a = 1\nprint(a)\n"
    assert _fix(text, _Breaks) == (text, 0, True, ["TST002", "TST002"])


def test_a_fix_that_never_settles_stops() -> None:
    text, fixed, converged, left = _fix("a = 1\n", _Keeps)
    assert not converged and left == ["TST003"]
    assert fixed == 10 and text == "(" * 10 + "a" + ")" * 10 + " = 1\n"
    check_text("t.py", text, CheckConfig(), rules=[_Keeps])  # it still parses


class _Crashes(_Names):
    code = "TST004"

    def check(self, unit: Unit) -> Iterator[Hit]:
        yield from super().check(unit)
        raise KeyError("boom")


def test_a_rule_that_fails_is_a_finding_and_the_other_rules_still_run() -> None:
    found = check_text("t.py", "a = 1\n", CheckConfig(), rules=[_Crashes, _Names])
    assert [(f.code, f.line, f.severity) for f in found] == [
        ("CHK002", 0, Severity.ERROR),
        ("TST001", 1, Severity.ERROR),
    ]
    assert found[0].message == "TST004 failed on this file (KeyError: 'boom')"
