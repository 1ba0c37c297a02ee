"""``flortrain check`` over the training scripts under fixtures/: each hazard a fixture marks
with an ``# expect: CODE`` comment is found on that line, and nothing else is (the clean
fixtures have no finding at all). Only the codes listed here are compared, so each rule family
owns its part of the table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flortrain.check.config import CheckConfig
from flortrain.check.runner import check_text
from tests.protocol import FIXTURES

#: the randomness rules: generators shared into workers, worker seeding, persistent workers
RNG_CODES = ("RNG001", "RNG004", "RNG005")
SCRIPTS = sorted(FIXTURES.rglob("*.py"))
_EXPECT = re.compile(r"#\s*expect:\s*([A-Z]{3}\d{3}(?:\s*,\s*[A-Z]{3}\d{3})*)")


def expected(path: Path, codes: tuple[str, ...]) -> set[tuple[int, str]]:
    out = set()
    for i, line in enumerate(path.read_text().splitlines(), 1):
        m = _EXPECT.search(line)
        if m:
            out |= {(i, c.strip()) for c in m.group(1).split(",") if c.strip() in codes}
    return out


def test_some_fixture_has_each_rng_hazard() -> None:
    marked = {c for p in SCRIPTS for _, c in expected(p, RNG_CODES)}
    assert marked == set(RNG_CODES)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(FIXTURES)))
def test_rng_findings_are_the_marked_ones(script: Path) -> None:
    found = check_text(str(script), None, CheckConfig(select=RNG_CODES))
    got = {(f.line, f.code) for f in found}
    assert got == expected(script, RNG_CODES), "\n".join(f.concise() for f in found)
