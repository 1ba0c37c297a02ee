"""The output formats of ``flortrain check``, one module each: ``concise`` for people, ``json``
(a stable schema, docs/check.md), ``github`` workflow annotations and ``sarif`` 2.1.0. Each
renders a :class:`~flortrain.check.report.Report`; the report knows none of them."""

from __future__ import annotations

from collections.abc import Callable

from flortrain.check.formats import concise, github, json_format, sarif
from flortrain.check.report import Report

RENDERERS: dict[str, Callable[[Report], str]] = {
    "concise": concise.render,
    "json": json_format.render,
    "github": github.render,
    "sarif": sarif.render,
}


def render(report: Report, fmt: str) -> str:
    """``report`` as ``--output-format fmt`` prints it."""
    return RENDERERS[fmt](report)
