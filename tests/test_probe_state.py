"""Probe state carried across main-loop iterations (a step counter, a list that accumulates, a
value kept for the next iteration, an object a probe made and changes).

No record holds it: the record never ran the probes. A serial replay keeps it in its process,
whatever it skips or jumps over; a parallel-replay worker would start it afresh at its segment,
so such a loop is replayed serially, and the replay says why. Ground truth is a plain run of the
probed script: its whole stdout, probe lines and all. The scripts train in plain Python: probe
state is Python's whatever a script trains, and a torch process costs about two CPU-seconds.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from flortrain.replay.preparation import static_replay
from tests.protocol import flortrain, plain, probe_lines, record

PARALLEL = {"FLORTRAIN_PERIOD": "every", "FLORTRAIN_SEGMENTS": "even"}


#: A linear fit by plain-Python SGD, an epoch loop (its main loop, M6 once recorded) over a
#: batch loop, with a marker where each kind of probe goes.
TRAIN = textwrap.dedent(
    """\
    import random

    random.seed(1)
    data = [(random.random(), random.random()) for _ in range(40)]
    w = [0.0, 0.0]
    #BEFORE
    for epoch in range(4):
        random.shuffle(data)
        total = 0.0
        for x, y in data:
            err = w[0] * x + w[1] - y
            w[0] -= 0.1 * err * x
            w[1] -= 0.1 * err
            total += err * err
            #INNER
        #OUTER
        print(epoch, total)
    #AFTER
    """
)

#: TRAIN as recorded: its markers left out
RECORDED = "\n".join(ln for ln in TRAIN.splitlines() if not ln.strip().startswith("#")) + "\n"


def _probed(
    before: str = "", inner: str = "", outer: str = "", after: str = "", top: str = ""
) -> str:
    """TRAIN with these probes at its markers (the markers without one left out)."""
    text = TRAIN
    for mark, code, indent in (
        ("#BEFORE", before, ""),
        ("#INNER", inner, " " * 8),
        ("#OUTER", outer, " " * 4),
        ("#AFTER", after, ""),
    ):
        lines = "".join(indent + ln + "\n" for ln in textwrap.dedent(code).splitlines())
        text = text.replace(" " * len(indent) + mark + "\n", lines)
    return textwrap.dedent(top) + text


def _carried(
    before: str = "", inner: str = "", outer: str = "", after: str = "", top: str = ""
) -> dict[str, str]:
    """The main loops whose probe state the plan of TRAIN with these probes finds carried."""
    text = _probed(before, inner, outer, after, top)
    return static_replay("train.py", RECORDED, text, [], 1).rplan.carried


def test_probe_state_carried_across_main_loop_iterations_is_replayed_serially(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text(RECORDED)
    truth = plain(script)
    rec = record(tmp_path, script.name, env=PARALLEL)
    assert rec.code == 0 and rec.out == truth.out, rec.err

    # a global step counter and a list of errors, bound before the main loop, changed in the
    # batch loop; the list's mean printed at every epoch's end
    inner = _probed(
        before="gstep = 0\nseen = []",
        inner=(
            "gstep += 1\n"
            "seen.append(err)\n"
            'if gstep % 25 == 0: print(f"PROBE step {gstep} {epoch} {err:.10f}")'
        ),
        outer='print(f"PROBE mean {epoch} {len(seen)} {sum(seen) / len(seen):.10f}")',
    )
    script.write_text(inner)
    want = plain(script)
    assert len(probe_lines(want.out)) == 6 + 4
    par = flortrain(tmp_path, "replay", script.name, "--jobs", "2", env=PARALLEL)
    assert par.code == 0, par.err
    assert par.out == want.out, par.err
    gstep_line = inner.splitlines().index("        gstep += 1") + 1
    assert (
        f"replaying serially: main loop M6 carries probe state: line {gstep_line} rebinds `gstep`,"
        " which the next iteration reads"
    ) in par.err, par.err
    assert flortrain(tmp_path, "diff").code == 0

    # in the main loop's body, with every batch loop skipped and restored (partial replay): a
    # value kept for the next iteration, and a counter. A serial replay keeps them in its process
    outer = _probed(
        before="epochs_seen = 0",
        outer=(
            "epochs_seen += 1\n"
            'if epoch > 0: print(f"PROBE {epochs_seen} {total:.10f} {total - prev:.12f}")\n'
            "prev = total"
        ),
    )
    script.write_text(outer)
    want = plain(script)
    assert len(probe_lines(want.out)) == 3
    rep = flortrain(tmp_path, "replay", script.name, env=PARALLEL)
    assert rep.code == 0 and probe_lines(rep.out) == probe_lines(want.out), rep.err
    assert "4 block instances skipped, 0 executed" in rep.err, rep.err
    par = flortrain(tmp_path, "replay", script.name, "--jobs", "2", env=PARALLEL)
    assert par.code == 0 and par.out == rep.out, par.err
    assert "replaying serially: main loop M6 carries probe state: line" in par.err, par.err


# -- the static rule, on each member of the class (no process: the plan alone) ------------------

CARRIED = {
    "a counter": {"before": "gstep = 0", "inner": "gstep += 1\nif gstep % 10 == 0: print(gstep)"},
    "a list that accumulates": {
        "before": "seen = []",
        "inner": "seen.append(err)",
        "outer": "print(sum(seen) / len(seen))",
    },
    "an item assigned": {"before": "hist = {}", "outer": "hist[epoch] = total"},
    "an augmented item": {"before": "hist = [0.0] * 4", "outer": "hist[0] += total"},
    "a method of an object a probe made": {
        "before": "log = open('probe.log', 'w')",
        "outer": "log.write(f'{total}\\n')",
    },
    "a step counter given to a writer": {
        "before": "step = 0\nlog = []",
        "inner": "step = step + 1",
        "outer": "print('x', total, step)",
    },
    "a value kept for the next iteration": {"outer": "if epoch: print(total - prev)\nprev = total"},
    "a probe function that appends": {
        "before": "seen = []\ndef note(v):\n    seen.append(v)",
        "outer": "note(total)",
    },
    "a probe function that rebinds a global": {
        "before": "n = 0\ndef tick():\n    global n\n    n += 1",
        "outer": "tick()",
    },
    "a lambda that appends": {
        "before": "seen = []\nnote = lambda v: seen.append(v)",
        "outer": "note(total)",
    },
    "an iterator a probe made": {
        "before": "ids = iter(range(100))",
        "outer": "print(next(ids), total)",
    },
    "an iterator advanced by a builtin": {
        "before": "ids = iter(range(100))",
        "outer": "print(list(zip(ids, range(2))))",
    },
    "a generator consumed by a for": {
        "before": "gen = (i * i for i in range(3))",
        "outer": "for v in gen:\n    print(v)",
    },
    "a binding read after the loop that an iteration may skip": {
        "outer": "if total < 1.0: small = epoch",
        "after": "print(small)",
    },
    "an object a probe made, changed by a function": {
        "before": "import heapq\nbest = []",
        "outer": "heapq.heappush(best, total)",
    },
}


@pytest.mark.parametrize("probes", CARRIED.values(), ids=CARRIED.keys())
def test_probe_state_carried_across_iterations_is_found(probes: dict[str, str]) -> None:
    carried = _carried(**probes)
    assert list(carried) == ["M6"], carried


NOT_CARRIED = {
    "a constant bound before the loop": {"before": "scale = 100", "outer": "print(total * scale)"},
    "a list made afresh every iteration": {"outer": "xs = []\nxs.append(total)\nprint(len(xs))"},
    "a name bound and read in one iteration": {"inner": "d = err * 2\nprint(d)"},
    "a binding every iteration makes, read after the loop": {
        "outer": "last = total",
        "after": "print(last)",
    },
    "reads of a list a probe made": {
        "before": "th = [0.1, 0.2]",
        "outer": "print(sum(th), th.count(0.1), [t for t in th if t < total])",
    },
    "a probe function that only computes": {
        "before": "def fmt(v):\n    return f'{v:.3f}'",
        "outer": "print(fmt(total))",
    },
    "a probe reading training state only": {"inner": "print(epoch, w[0], err)"},
}


@pytest.mark.parametrize("probes", NOT_CARRIED.values(), ids=NOT_CARRIED.keys())
def test_probe_state_not_carried_is_not_flagged(probes: dict[str, str]) -> None:
    assert _carried(**probes) == {}


def test_a_probe_in_a_function_the_loop_calls_that_appends_to_a_global_is_found() -> None:
    # the helper is called from the main loop; the probe's list is the module's
    top = """\
        import math
        seen = []
        def score(v):
            seen.append(v)
            return math.sqrt(v)
        """
    recorded_top = "import math\ndef score(v):\n    return math.sqrt(v)\n"
    text = textwrap.dedent(top) + TRAIN.replace("        #OUTER\n", "        print(score(total))\n")
    recorded = recorded_top + TRAIN.replace("        #OUTER\n", "        print(score(total))\n")
    recorded = (
        "\n".join(ln for ln in recorded.splitlines() if not ln.strip().startswith("#")) + "\n"
    )
    carried = static_replay("train.py", recorded, text, [], 1).rplan.carried
    assert carried == {"M9": "line 4, in `score()`, changes `seen`, which outlives the call"}
