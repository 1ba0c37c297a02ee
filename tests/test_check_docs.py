"""docs/check.md is generated from the rules (their messages, docs and own cases): it must be
exactly what the generator prints, so it cannot drift from what the rules do."""

from __future__ import annotations

from pathlib import Path

from flortrain.check.docs import generate
from flortrain.check.pyproject import load, read_table
from flortrain.check.rules import all_rules

PAGE = Path(__file__).parent.parent / "docs" / "check.md"


def test_docs_page_is_generated_from_the_rules() -> None:
    text = generate()
    assert PAGE.read_text(encoding="utf-8") == text, (
        "docs/check.md is stale: regenerate it with `python -m flortrain.check.docs > docs/check.md`"
    )
    codes = [r.code for r in all_rules()]
    headings = [ln.removeprefix("### ") for ln in text.splitlines() if ln.startswith("### ")]
    assert headings == codes  # one section per rule, in code order


def test_the_documented_configuration_loads(tmp_path: Path) -> None:
    """The page's example table is a valid configuration (its keys and codes exist)."""
    text = generate()
    block = text.split("```toml\n[tool.flortrain.check]\n", 1)[1].split("```", 1)[0]
    (tmp_path / "pyproject.toml").write_text("[tool.flortrain.check]\n" + block)
    table = read_table(str(tmp_path / "pyproject.toml"))
    assert table is not None
    config = load(str(tmp_path / "pyproject.toml"), table)
    assert config.severity_of("DET101") == "warning" and config.severity_of("DET001") == "error"
    assert not config.enabled("DET101") and config.enabled("CHK001")
