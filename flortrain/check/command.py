"""``flortrain check`` end to end: configuration, files, findings, fixes, output, exit code
(0: no error-level finding, 1: some, 2: bad usage or configuration)."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass

import click

from flortrain.check.discovery import discover
from flortrain.check.fix import ROUNDS, applicable, fix_text, write
from flortrain.check.formats import render
from flortrain.check.pyproject import Configs, cli_selection
from flortrain.check.report import Report
from flortrain.check.runner import check_text, unparsable
from flortrain.errors import FlortrainError, Located
from flortrain.static.text import read_text


@dataclass(frozen=True)
class Options:
    paths: tuple[str, ...]
    fmt: str = "concise"
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False
    exit_zero: bool = False
    config: str | None = None
    isolated: bool = False
    force_exclude: bool = False
    select: tuple[str, ...] = ()
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


def run(o: Options) -> int:
    for p in o.paths:
        if not os.path.exists(p):
            raise FlortrainError("no such file or directory", Located(p), "FT001")
    configs = Configs(o.config, o.isolated, cli_selection(o.select, o.extend_select, o.ignore))
    report = Report([], unsafe_fixes=o.unsafe_fixes)
    diffs: list[str] = []
    for path in discover(o.paths, configs, o.force_exclude):
        _one_file(path, configs, o, report, diffs)
    report.findings.sort(key=lambda f: (f.path, f.line, f.col, f.code))  # ruff's order
    if o.diff:
        return _show_diffs(diffs, report.fixed)
    text = render(report, o.fmt)
    if text:  # github annotations: nothing at all when nothing was found
        click.echo(text)
    return 0 if o.exit_zero or not report.errors else 1


def _one_file(path: str, configs: Configs, o: Options, report: Report, diffs: list[str]) -> None:
    try:
        text = read_text(path)
    except FlortrainError as e:
        report.findings.append(unparsable(path, None, e))
        return
    config = configs.for_file(path)
    found = check_text(path, text, config)
    if (o.fix or o.diff) and any(applicable(f, o.unsafe_fixes) for f in found):
        result = fix_text(text, found, lambda t: check_text(path, t, config), o.unsafe_fixes)
        if not result.converged:
            click.echo(f"{path}: fixes did not settle in {ROUNDS} rounds", err=True)
        if result.fixed and o.diff:
            diffs.append(_diff(path, text, result.text))
        elif result.fixed:
            write(path, result.text)
        report.fixed += result.fixed
        text, found = result.text, result.findings
    if any(f.fix is not None for f in found):
        report.texts[path] = text
    report.findings.extend(found)


def _diff(path: str, before: str, after: str) -> str:
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), path, path
    )
    return "".join(lines)


def _show_diffs(diffs: list[str], fixed: int) -> int:
    """``--diff``: the fixes as a patch, nothing written; exit 1 when there is one (as ruff)."""
    for d in diffs:
        click.echo(d, nl=not d.endswith("\n"))
    click.echo(f"Would fix {fixed} finding{'' if fixed == 1 else 's'}.", err=True)
    return 1 if diffs else 0
