"""Every rule's own cases (``Rule.valid`` / ``Rule.invalid``) as tests: a valid case has no
finding of the rule, an invalid one has it at the given line and column, and its fix, when the
case gives one, produces exactly the fixed text, which the rule then accepts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flortrain.check.config import CheckConfig
from flortrain.check.fix import apply
from flortrain.check.rule import Invalid, Rule, Valid
from flortrain.check.rules import all_rules
from flortrain.check.runner import check_text

RULES = all_rules()


def _cases(kind: str) -> list[tuple[type[Rule], int, Valid | Invalid]]:
    return [(r, i, c) for r in RULES for i, c in enumerate(getattr(r, kind))]


def _id(case: tuple[type[Rule], int, object]) -> str:
    return f"{case[0].code}-{case[1]}"


def _run(rule: type[Rule], case: Valid | Invalid, tmp_path: Path) -> list:  # type: ignore[type-arg]
    for name, text in case.files:
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    script = tmp_path / "train.py"
    script.write_text(case.text)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        found = check_text("train.py", None, CheckConfig(select=(rule.code,)))
    finally:
        os.chdir(cwd)
    return found


def test_every_rule_has_cases() -> None:
    assert RULES, "no rule was found"
    for r in RULES:
        assert r.valid and r.invalid, f"{r.code} needs valid and invalid cases"
        assert r.code[:3].isalpha() and r.code[3:].isdigit() and len(r.code) == 6, r.code


@pytest.mark.parametrize("case", _cases("valid"), ids=_id)
def test_valid(case: tuple[type[Rule], int, Valid], tmp_path: Path) -> None:
    rule, _, c = case
    found = [f for f in _run(rule, c, tmp_path) if f.code == rule.code]
    assert found == [], f"{rule.code} reported valid code:\n{c.text}\n" + "\n".join(
        f.concise() for f in found
    )


@pytest.mark.parametrize("case", _cases("invalid"), ids=_id)
def test_invalid(case: tuple[type[Rule], int, Invalid], tmp_path: Path) -> None:
    rule, _, c = case
    found = [f for f in _run(rule, c, tmp_path) if f.code == rule.code]
    where = [(f.line, f.col) for f in found]
    assert any(f.line == c.line and (not c.col or f.col == c.col) for f in found), (
        f"{rule.code} expected at {c.line}:{c.col}, found at {where} in:\n{c.text}"
    )
    fixable = [f for f in found if f.fix is not None]
    if c.fixed is None:
        assert not any(f.fix.safe for f in fixable if f.fix), "a safe fix the case does not show"
        return
    fixed, n = apply(c.text, fixable, unsafe=True)
    assert n and fixed == c.fixed
    after = check_text("train.py", fixed, CheckConfig(select=(rule.code,)))
    assert [f for f in after if (f.line, f.col) == (c.line, c.col)] == []
