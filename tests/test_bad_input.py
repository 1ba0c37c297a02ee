"""Bad and unusual input: each is a one-line refusal (exit 2, located) or a correct run, the
record printing what ``python`` prints and the replay's probe lines what ``python`` prints for
the probed script. Pure-Python training loops: every process starts in a fraction of a second."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.protocol import flortrain, plain, probe_lines

EVERY = {"FLORTRAIN_PERIOD": "every"}


def _refused(tmp: Path, data: bytes, code: str, where: str) -> None:
    (tmp / "train.py").write_bytes(data)
    for cmd in (["record", "train.py"], ["instrument", "train.py"]):
        r = flortrain(tmp, *cmd)
        lines = [ln for ln in r.err.splitlines() if ln.strip()]
        assert r.code == 2 and len(lines) == 1 and "Traceback" not in r.err, r.err
        assert lines[0].startswith(f"train.py{where}: {code} "), lines[0]
        assert r.out == ""


def test_a_syntax_error_is_located(tmp_path: Path) -> None:
    _refused(tmp_path, b"import random\nfor i in range(3)\n    print(i)\n", "FT002", ":2:18")


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    # Latin-1 bytes without a coding declaration: python refuses the file too
    _refused(tmp_path, b"# caf\xe9\nprint(1)\n", "FT001", "")
    assert plain(tmp_path / "train.py").code != 0


def _protocol(tmp: Path, text: str, probe: str | None, env: dict[str, str] | None = None) -> None:
    """record == python (stdout and exit code); with a probe (replacing ``#PROBE``), the replay's
    probe lines are the plain probed run's and diff passes."""
    script = tmp / "train.py"
    script.write_text(text)
    truth = plain(script)
    rec = flortrain(tmp, "record", "train.py", env={**EVERY, **(env or {})})
    assert rec.out == truth.out and rec.code == truth.code, rec.err
    assert "Traceback" not in rec.err or "Traceback" in truth.err
    if probe is None:
        return
    marker = next(ln for ln in text.splitlines() if ln.strip() == "#PROBE")
    indent = marker[: len(marker) - len(marker.lstrip())]
    script.write_text(text.replace(marker, indent + probe))
    want = probe_lines(plain(script).out)
    assert want, "the probe printed nothing in a plain run"
    rep = flortrain(tmp, "replay", "train.py", env=EVERY)
    assert rep.code == truth.code and probe_lines(rep.out) == want, rep.err
    if truth.code == 0:
        d = flortrain(tmp, "diff")
        assert d.code == 0, d.out + d.err


def test_an_empty_file(tmp_path: Path) -> None:
    _protocol(tmp_path, "", None)


def test_a_script_with_no_loops(tmp_path: Path) -> None:
    _protocol(tmp_path, "import random\nrandom.seed(1)\nprint(random.random())\n", None)


LOOP = textwrap.dedent(
    """\
    import random
    import sys

    random.seed(7)
    w = 0.0
    data = [random.random() for _ in range(20)]
    for epoch in range(4):
        total = 0.0
        for x in data:
            w -= 0.1 * (w - x)
            total += (w - x) ** 2
        #PROBE
        print(f"epoch {epoch} total {total:.12f}")
        EXTRA
    print("done")
    """
)


def test_sys_exit_in_the_main_loop_keeps_the_exit_code(tmp_path: Path) -> None:
    text = LOOP.replace("    EXTRA", "    if epoch == 2:\n        sys.exit(3)")
    _protocol(tmp_path, text, "print('PROBE', epoch, repr(w))")


@pytest.mark.parametrize(
    "extra",
    [
        "exec('w = w * 1.0')",  # exec rebinding a training name inside the main loop
        "total = eval('total + 0.0')",
    ],
)
def test_exec_and_eval(tmp_path: Path, extra: str) -> None:
    text = "exec('import math')\n" + LOOP.replace("    EXTRA", f"    {extra}")
    _protocol(tmp_path, text, "print('PROBE', epoch, repr(w), math.pi)")


def test_a_generator_feeds_the_main_loop(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import random

        def batches(data, size):
            order = list(range(len(data)))
            random.shuffle(order)
            for i in range(0, len(order), size):
                yield [data[j] for j in order[i:i + size]]

        random.seed(5)
        data = [random.random() for _ in range(24)]
        w = 0.0
        for epoch in range(3):
            total = 0.0
            for batch in batches(data, 6):
                for x in batch:
                    w -= 0.05 * (w - x)
                    total += (w - x) ** 2
            #PROBE
            print(f"epoch {epoch} {total:.12f}")
        """
    )
    _protocol(tmp_path, text, "print('PROBE', epoch, repr(w))")


def test_the_training_loop_inside_a_generator(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import random

        def train(epochs):
            random.seed(2)
            w = 0.0
            for epoch in range(epochs):
                total = 0.0
                for _ in range(10):
                    x = random.random()
                    w -= 0.1 * (w - x)
                    total += (w - x) ** 2
                #PROBE
                yield epoch, total

        for epoch, total in train(3):
            print(f"epoch {epoch} {total:.12f}")
        """
    )
    _protocol(tmp_path, text, "print('PROBE', epoch, repr(w))")


def test_async_steps_in_the_main_loop(tmp_path: Path) -> None:
    text = textwrap.dedent(
        """\
        import asyncio
        import random

        async def step(w, x):
            await asyncio.sleep(0)
            return w - 0.1 * (w - x)

        random.seed(4)
        w = 0.0
        for epoch in range(3):
            total = 0.0
            for _ in range(8):
                x = random.random()
                w = asyncio.run(step(w, x))
                total += (w - x) ** 2
            #PROBE
            print(f"epoch {epoch} {total:.12f}")
        """
    )
    _protocol(tmp_path, text, "print('PROBE', epoch, repr(w))")
