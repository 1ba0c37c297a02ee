"""The replay's steady heap (``runtime/allocator.py``): large blocks freed and allocated again
reuse the heap's pages instead of faulting in fresh ones, and the knob turns it off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.protocol import flortrain

#: glibc's ``mallinfo2``: how much of the heap is mapped on its own and how much is free in it
_MALLINFO = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)

#: After ``allocator.steady()``: a 16 MB tensor allocated (is it a mapping of its own?) and freed
#: (is its memory still free in the heap, for the next step?), then a step's worth of large
#: tensors (three of 16 MB: a gradient, an activation, an optimizer's temporary) allocated and
#: freed nine times, counting each step's page faults. Prints whether steady() took effect, the
#: two answers, and the faults of each step.
CHURN = textwrap.dedent(f"""\
    import ctypes, resource, torch
    from flortrain.runtime import allocator
    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in {_MALLINFO!r}]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = Info
    on = allocator.steady()
    t = torch.ones(4 << 20)
    mapped = libc.mallinfo2().hblkhd >= 16 << 20
    del t
    kept = libc.mallinfo2().fordblks >= 16 << 20
    def step():
        a, b, c = torch.ones(4 << 20), torch.ones(4 << 20), torch.ones(4 << 20)
        del a, b, c
    step()
    faults = []
    for _ in range(9):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        step()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(on, mapped, kept, ",".join(map(str, faults)))
""")


def _churn(allocator: str) -> tuple[str, str, str, list[int]]:
    env = {**os.environ, "FLORTRAIN_REPLAY_ALLOCATOR": allocator}
    out = subprocess.run(
        [sys.executable, "-c", CHURN], capture_output=True, text=True, env=env, check=True
    ).stdout
    on, mapped, kept, faults = out.split()
    return on, mapped, kept, [int(f) for f in faults.split(",")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_a_steady_heap_keeps_large_blocks_and_what_is_freed() -> None:
    # malloc as it is maps a 16 MB block on its own and unmaps it when freed (its initial mmap
    # threshold is 128 KB); a steady heap serves it from the heap and keeps it there when freed
    assert _churn("default")[:3] == ("False", "True", "False")
    on, mapped, kept, faults = _churn("steady")
    assert (on, mapped, kept) == ("True", "False", "True")
    # the steps reuse the heap's pages: a step may fault in a block's worth (4096 pages of 4 KB)
    # while the heap grows to what a step needs, most steps fault in nothing; malloc as it is
    # maps and faults in its three blocks afresh at nearly every step (12k faults a step)
    assert sum(f == 0 for f in faults) >= 6, faults


def test_a_bad_allocator_knob_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("for i in range(2):\n    print(i)\n")
    assert flortrain(tmp_path, "record", "train.py").code == 0
    r = flortrain(tmp_path, "replay", "train.py", env={"FLORTRAIN_REPLAY_ALLOCATOR": "jemalloc"})
    assert r.code == 2, r.err
    assert (
        r.err.strip()
        .splitlines()[-1]
        .endswith("FLORTRAIN_REPLAY_ALLOCATOR='jemalloc' must be one of steady, default")
    ), r.err
    assert "Traceback" not in r.err
