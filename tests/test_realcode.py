"""The correctness protocol on the shapes of public training scripts (fixtures/realcode).

Each fixture mirrors the structure of a script users actually run (pytorch/examples, nanoGPT)
at a tiny CPU size, with probe markers: ``outer`` in the main loop's body, ``inner`` in the
batch loop, and ``call`` where a probe calls the script's own evaluation function (whose loop
is memoized). Plain ``python`` is the ground truth for every replay. Checkpoints are taken at
every instance (FLORTRAIN_PERIOD=every) so the skip path runs wherever memoization applies.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.protocol import FIXTURES, block_states, flortrain, latest_run, plain, probe_lines

REALCODE = FIXTURES / "realcode"
EVERY = {"FLORTRAIN_PERIOD": "every"}
MARKER = re.compile(r"^(?P<indent>[ \t]*)# flortrain-probe (?P<kind>\w+): (?P<stmt>.+)$")

#: Fixtures whose main-loop work cannot be memoized, and why the replay must still be exact:
#: their episode loops keep per-step tensors with autograd graphs until the episode's update,
#: which a checkpoint cannot hold (docs/limitations.md).
EXECUTES = {"reinforce": "autograd graph", "actor_critic": "autograd graph"}


#: Shapes replayed by two workers as well: nanoGPT's ``while True`` step loop and a ``for`` epoch
#: loop over a DataLoader (every fixture is, in test_protocol.py; CI time keeps it to these here).
PARALLEL = frozenset({"nanogpt", "mnist"})


def _shapes() -> list[tuple[str, tuple[str, ...]]]:
    """Each real-code shape with the probe kinds it marks."""
    out = []
    for p in sorted(REALCODE.glob("*.py")):
        kinds = sorted(
            {m.group("kind") for line in p.read_text().splitlines() if (m := MARKER.match(line))}
        )
        out.append((p.stem, tuple(kinds)))
    return out


def _probed(text: str, kind: str) -> str:
    lines = []
    for line in text.splitlines(keepends=True):
        m = MARKER.match(line.rstrip("\n"))
        lines.append(
            f"{m.group('indent')}{m.group('stmt')}\n" if m and m.group("kind") == kind else line
        )
    return "".join(lines)


def _record(name: str, into: Path) -> tuple[Path, str, str]:
    """Record the fixture; returns the script, what python printed, and the record's stderr."""
    script = into / f"{name}.py"
    text = (REALCODE / f"{name}.py").read_text()
    script.write_text(text)
    truth = plain(script)
    assert truth.code == 0, truth.err
    rec = flortrain(into, "record", script.name, env=EVERY)
    assert rec.code == 0, rec.err
    assert rec.out == truth.out  # 1. record prints exactly what python prints
    return script, truth.out, rec.err


@pytest.mark.parametrize(("name", "kinds"), _shapes())
def test_realcode_replay_is_exact(name: str, kinds: tuple[str, ...], tmp_path: Path) -> None:
    """One record of the shape, then a replay of every probe kind it marks (each replay is
    checked against its own plain probed run, and by diff)."""
    script, truth, record_err = _record(name, tmp_path)
    original = script.read_text()
    states = block_states(tmp_path / ".flortrain", 1)
    if name in EXECUTES:
        assert EXECUTES[name] in record_err
    else:
        assert states.get("checkpointed", 0) > 0, states
    for kind in kinds:
        _replay_kind(name, kind, script, original, truth, states, tmp_path)


def _replay_kind(
    name: str,
    kind: str,
    script: Path,
    original: str,
    truth: str,
    recorded: dict[str, int],
    tmp_path: Path,
) -> None:
    script.write_text(_probed(original, kind))
    expected = plain(script)
    assert expected.code == 0, expected.err
    want = probe_lines(expected.out)
    assert want, f"the {kind} probe printed nothing in a plain run"
    # the probed script prints the same non-probe lines: the probe only observes
    assert [
        ln for ln in expected.out.splitlines() if not ln.startswith("PROBE")
    ] == truth.splitlines()

    rep = flortrain(
        tmp_path, "replay", script.name, env=EVERY
    )  # 2. the probe sees what python shows
    assert rep.code == 0, rep.err
    assert probe_lines(rep.out) == want, rep.err
    replay = latest_run(tmp_path)
    got = block_states(tmp_path / ".flortrain", int(replay["id"]))  # type: ignore[call-overload]
    if kind == "inner":
        assert "is inside it" in rep.err and got.get("executed", 0) > 0, (got, rep.err)
    else:
        # partial replay: every instance the record checkpointed is restored (the evaluation a
        # `call` probe runs once more inside the probe takes no instance of the record), and
        # only those it could not checkpoint execute: none but in the shapes EXECUTES names
        checkpointed, total = recorded.get("checkpointed", 0), sum(recorded.values())
        assert got.get("skipped", 0) == checkpointed, (got, recorded)
        assert got.get("executed", 0) == total - checkpointed, (got, recorded)
        assert (checkpointed < total) == (name in EXECUTES), recorded

    d = flortrain(tmp_path, "diff")  # 3. diff proves the replay faithful
    assert d.code == 0, d.out + d.err

    if (
        kind == "inner" and name in PARALLEL
    ):  # where parallel replay pays: two workers, the same output
        par = flortrain(
            tmp_path,
            "replay",
            script.name,
            "--jobs",
            "2",
            env={**EVERY, "FLORTRAIN_SEGMENTS": "even"},
        )
        assert par.code == 0, par.err
        assert "worker 2/2 done" in par.err, par.err
        assert par.out == rep.out, par.err
        d = flortrain(tmp_path, "diff")
        assert d.code == 0, d.out + d.err
