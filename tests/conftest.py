"""Test-session settings.

The suite runs two pytest workers on a two-core machine, and nearly every test starts training
processes. With torch's default of one intra-op thread per core, two workers' trainings would
run four OpenMP threads on two cores, and spin-waiting threads slow each other badly
(docs/parallel.md measured 2.66x for two 2-thread trainings side by side). So subprocesses get one
intra-op thread unless a test asks for more: the ground truth (``python script.py``), the record
and the replay all inherit the same setting, so every comparison stays like for like. The tests
that are about thread counts set ``OMP_NUM_THREADS`` themselves (test_runtime's pinning test
records with one thread and replays under two; test_parallel's direct-resume test trains with two).

``flortrain record`` runs ``flortrain check`` on the script before training. That is one to two
seconds of CPU per record, several minutes over the suite's records, and it changes nothing a
record or replay computes; so it is off here (``FLORTRAIN_CHECK=off``) except in the tests of
that feature, which turn it on (tests/test_check_record.py, tests/test_check_fixtures_rpl.py).

Each of those processes imports flortrain. Where ``PYTHONDONTWRITEBYTECODE`` is set (as on this
machine) no process writes the bytecode it compiles, so every one of them compiles flortrain's
modules from source again: 0.13 s of CPU a process (a record of a pure-Python script took 0.53 s
without the bytecode, 0.40 s with it). So the session compiles the package's bytecode once before
the first test; a module edited during the session is compiled afresh by Python as usual (the
cache is checked against the source's time and size).
"""

from __future__ import annotations

import compileall
import json
import os
import resource
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.protocol import CPU_LOG, PLAIN_RUNS, RECORDS

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("FLORTRAIN_CHECK", "off")

#: the package under test, whose bytecode the session compiles once (see above)
PACKAGE = Path(__file__).resolve().parent.parent / "flortrain"


def pytest_configure(config: pytest.Config) -> None:
    """The package's bytecode compiled (see above), and one directory of plain runs
    (``tests/protocol.plain``) and one of records (``tests/protocol.record``) for the session,
    shared by the xdist workers, which inherit the controller's environment. Set a variable empty
    to run every ground truth or record afresh."""
    if hasattr(config, "workerinput"):
        return
    compileall.compile_dir(PACKAGE, quiet=1)
    for name in (PLAIN_RUNS, RECORDS):
        if name not in os.environ:
            kept = os.environ[name] = tempfile.mkdtemp(prefix=f"{name.lower()}-")
            config.add_cleanup(lambda kept=kept: shutil.rmtree(kept, ignore_errors=True))


# -- the order tests are handed out in -------------------------------------------------------------
#: Modules whose tests take the most CPU each (measured with FLORTRAIN_TEST_CPU_LOG, below), run
#: first. pytest-xdist's worksteal gives each worker a contiguous share of the collection and lets
#: the idle one take the back half of the other's queue, so whatever runs last comes from the ends
#: of the queues: in collection order a minute-long test can be the one left running while the
#: other worker idles; this way what is left at the end takes seconds.
LONG_FIRST = (
    "test_ray_backend.py",
    "test_fault_injection.py",
    "test_realcode.py",
    "test_protocol.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: in-file order kept


# -- the fault-injection suite's figures (tests/test_fault_injection.py) ------------------------
# Each of its tests adds the figures of its trials; they are summed and printed at the end of
# the run, also when pytest-xdist ran the tests in worker processes (which send them back).
_FIGURES: list[dict[str, Any]] = []


@pytest.fixture
def fault_figures() -> list[dict[str, Any]]:
    return _FIGURES


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["fault_figures"] = json.dumps(_FIGURES)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    _FIGURES.extend(json.loads(getattr(node, "workeroutput", {}).get("fault_figures", "[]")))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    total: dict[str, int] = {}
    for f in _FIGURES:
        for k, v in f.items():
            if isinstance(v, int):
                total[k] = total.get(k, 0) + v
    kinds: dict[str, int] = {}
    for f in _FIGURES:
        for k, v in f["faults_by_kind"].items():
            kinds[k] = kinds.get(k, 0) + v
    terminalreporter.write_sep(
        "-", "fault injection (short mode; benchmarks/fault_injection.py is the long one)"
    )
    terminalreporter.write_line(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in total.items()))
    terminalreporter.write_line(
        "faults by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
    )


# -- where the suite's CPU goes ------------------------------------------------------------------
# Wall times on a shared machine say more about the neighbours than about the tests; CPU time does
# not. With FLORTRAIN_TEST_CPU_LOG set to a file, each test appends one line: its node id, the CPU
# seconds of the processes it started and waited for (their own children included), and its own
# (``tests/protocol.CPU_LOG``).


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Any:
    log = os.environ.get(CPU_LOG)
    if not log:
        yield
        return
    kids, own = (
        resource.getrusage(resource.RUSAGE_CHILDREN),
        resource.getrusage(resource.RUSAGE_SELF),
    )
    yield
    kids2, own2 = (
        resource.getrusage(resource.RUSAGE_CHILDREN),
        resource.getrusage(resource.RUSAGE_SELF),
    )
    child = kids2.ru_utime + kids2.ru_stime - kids.ru_utime - kids.ru_stime
    self_ = own2.ru_utime + own2.ru_stime - own.ru_utime - own.ru_stime
    with open(log, "a") as f:
        f.write(f"{item.nodeid}\t{child:.2f}\t{self_:.2f}\n")
