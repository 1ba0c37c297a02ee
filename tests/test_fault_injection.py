"""The fault-injection suite, short mode (tests/faults.py has the harness and says what each
fault and outcome means; benchmarks/fault_injection.py runs the long mode, 30+ kills).

Every trial must end as an exact replay or a clean refusal: no silent wrong answer, and no
training run broken by flortrain. Seeds are fixed, so a failure names a trial that reproduces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults import NEEDS_NAMESPACE, STORE_FAULTS, Tally, namespaces_available, run_suite


def _check(tally: Tally, figures: list[dict[str, Any]]) -> None:
    figures.append(tally.figures())
    bad = tally.failures()
    assert not bad, "\n".join(map(str, bad))
    assert tally.later_records_ok == tally.later_records, tally.figures()


@pytest.mark.parametrize(
    ("seed", "fixtures"), [(1, ("while_early_stop",)), (2, ("dataloader_workers",))]
)
def test_records_killed_at_random_moments(
    seed: int, fixtures: tuple[str, ...], tmp_path: Path, fault_figures: list[dict[str, Any]]
) -> None:
    tally = run_suite(tmp_path, seed, kills=2, store_faults=0, fixtures=fixtures)
    assert len(tally.trials) == 2
    _check(tally, fault_figures)
    # a kill that lands after the run began leaves a run whose checkpoints all verified
    assert any(t.outcome == "exact" for t in tally.trials), tally.trials


DAMAGE = tuple(f for f in STORE_FAULTS if f.startswith(("blob-", "object-")))
DATABASE = tuple(f for f in STORE_FAULTS if f not in DAMAGE)


def test_damaged_checkpoints_are_re_executed_with_a_warning(
    tmp_path: Path, fault_figures: list[dict[str, Any]]
) -> None:
    tally = run_suite(
        tmp_path, 3, kills=0, store_faults=len(DAMAGE), fixtures=("module_level",), faults=DAMAGE
    )
    _check(tally, fault_figures)
    assert [t.outcome for t in tally.trials] == ["exact"] * len(DAMAGE), tally.trials
    assert tally.warnings_naming_damage == len(DAMAGE), tally.trials


def test_database_and_filesystem_faults(
    tmp_path: Path, fault_figures: list[dict[str, Any]]
) -> None:
    if not namespaces_available():
        pytest.skip("no unprivileged user namespaces here: enospc and read-only need `unshare -rm`")
    tally = run_suite(
        tmp_path,
        4,
        kills=0,
        store_faults=len(DATABASE),
        fixtures=("module_level",),
        faults=DATABASE,
    )
    _check(tally, fault_figures)
    outcome = {t.fault: t.outcome for t in tally.trials}
    assert set(outcome) == set(DATABASE)
    # a write lock held past the timeout: the replay cannot begin its run, and says so
    assert outcome["db-locked"] == "refused"
    # a store that cannot be written: record and replay refuse before running anything
    assert {t.outcome for t in tally.trials if t.fault == "read-only"} == {"refused"}
    # the record survives a lock held mid-run and a full disk, and its replay is exact
    assert outcome["db-locked-record"] == "exact" and outcome["enospc"] == "exact", tally.trials
    assert set(outcome) >= NEEDS_NAMESPACE
