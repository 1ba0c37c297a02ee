"""Deciding apart from doing: the adaptive period is asked only by the session that hosts the
blocks, never by what captures, stages or writes a checkpoint."""

from __future__ import annotations

import grimp

PERIOD = "flortrain.checkpoint.period"
#: the period's callers: the session that owns it and the protocol a block asks it through
CALLERS = {"flortrain.runtime.session", "flortrain.runtime.host"}


def test_only_the_period_s_callers_import_it() -> None:
    graph = grimp.build_graph("flortrain")
    importers = graph.find_modules_that_directly_import(PERIOD)
    assert importers == CALLERS
    doers = graph.find_descendants("flortrain.checkpoint") - {PERIOD}
    assert doers, "the checkpoint package has modules besides the period"
    assert not {m for m in doers if graph.chain_exists(m, PERIOD)}
