"""The staging arena's warm pages (``checkpoint/arena.py``) and the writer's look at idle cores
before it starts an item on idle CPU (``pace.IdleCores``). Page faults are counted by the
kernel (``getrusage``), not timed, so these do not depend on the machine's speed."""

from __future__ import annotations

import mmap
import os
import resource
import socket
from pathlib import Path

import pytest

from flortrain.checkpoint import arena
from flortrain.checkpoint.arena import Warmer, populate, resident_budget
from flortrain.checkpoint.materializer import BackgroundMaterializer
from flortrain.checkpoint.pace import IDLE_LOOK, SMALL_ITEM, IdleCores, may_start_idle
from flortrain.checkpoint.writer import map_until_asked
from flortrain.store.db import Store
from tests.outcomes import Outcomes

MB = 1 << 20
PAGES = 16 * MB // mmap.PAGESIZE


def _faults_writing(area: mmap.mmap, start: int, end: int) -> int:
    """Page faults this thread takes writing ``area[start:end]``."""
    chunk = b"\x5a" * MB
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for off in range(start, end, MB):
        area[off : off + MB] = chunk
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def _populate_supported() -> bool:
    with mmap.mmap(-1, mmap.PAGESIZE) as probe:
        return populate(probe, 0, mmap.PAGESIZE)


def test_a_warmed_arena_is_written_without_page_faults_and_its_bytes_are_left_alone() -> None:
    if not _populate_supported():  # Linux before 5.14: nothing is warmed, staging faults as ever
        with mmap.mmap(-1, 16 * MB) as area:
            w = Warmer(area, 16 * MB)
            w.start()
            w.join()
            assert w.done == 0 and not w.covers(1)
        return
    with mmap.mmap(-1, 32 * MB) as area:
        area[0:4] = b"keep"  # staged already when the warmer gets there: it must not be touched
        area[20 * MB : 20 * MB + 4] = b"cold"
        w = Warmer(area, 16 * MB)
        w.start()
        w.join()
        assert w.done == 16 * MB and w.covers(16 * MB) and not w.covers(16 * MB + 1)
        assert area[0:4] == b"keep" and area[4:8] == bytes(4)
        warm = _faults_writing(area, 0, 16 * MB)
        cold = _faults_writing(area, 16 * MB, 32 * MB)
        assert area[20 * MB : 20 * MB + 4] == b"\x5a" * 4
    assert warm < PAGES // 16, f"{warm} faults writing {PAGES} warmed pages"
    assert cold >= PAGES * 9 // 10, f"{cold} faults writing {PAGES} pages never touched"


def test_a_warmer_stopped_at_the_loop_entry_leaves_the_rest_to_staging() -> None:
    with mmap.mmap(-1, 4 * arena.CHUNK) as area:
        w = Warmer(area, 4 * arena.CHUNK)
        w.stop()  # training began before the thread got going
        w.start()
        w.join()
        assert w.done == 0 and not w.covers(mmap.PAGESIZE)


def test_the_writer_maps_warm_pages_only_until_the_parent_sends_something() -> None:
    """A script that ends before warming does says ``stop`` at once; the writer must answer it
    then, not after mapping 256 MB (which added 0.2 s to a one-line script's record)."""
    a, b = socket.socketpair()
    with a, b, mmap.mmap(-1, 4 * arena.CHUNK) as area:
        view = memoryview(area)
        try:
            assert map_until_asked(b, view, 4 * arena.CHUNK) == (
                4 * arena.CHUNK if _populate_supported() else 0
            )
            a.send(b"x")  # a message is waiting: nothing more is mapped
            assert map_until_asked(b, view, 4 * arena.CHUNK) == 0
        finally:
            view.release()


def test_the_warmed_size_is_bounded_by_the_arena_and_by_available_memory(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000000 kB\nMemAvailable:     800000 kB\n")
    assert resident_budget(256 * MB, 64 * MB, str(meminfo)) == 64 * MB
    capped = resident_budget(256 * MB, 2048 * MB, str(meminfo))
    assert capped <= 800000 * 1024 // 8 and capped % mmap.PAGESIZE == 0 and capped > 90 * MB
    assert resident_budget(256 * MB, 2048 * MB, str(tmp_path / "absent")) == 256 * MB


def _stat(path: Path, busy: int, idle: int) -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    path.write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_idle_cores_are_read_from_proc_stat_and_a_stale_look_says_look_again(
    tmp_path: Path,
) -> None:
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    _stat(stat, 1000, 1000)
    cpu = IdleCores(str(stat))
    _stat(stat, 1000 + 2 * tick, 1000)  # two seconds of all cores, none of them idle
    assert cpu.idle(window=60) < 0.1
    _stat(stat, 1000 + 2 * tick, 1000 + 2 * tick)  # then two seconds all idle
    assert cpu.idle(window=60) == pytest.approx(cpu.cores, abs=0.1)
    _stat(stat, 1000 + 4 * tick, 1000 + 2 * tick)
    assert cpu.idle(window=0) == 0.0, "an average reaching back past the window is not trusted"
    assert IdleCores(str(tmp_path / "absent")).idle(window=60) == cpu.cores, "unknown: idle"


def test_a_large_item_waits_for_an_idle_core_and_a_small_one_does_not(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    _stat(stat, 0, 0)
    cpu = IdleCores(str(stat))
    _stat(stat, 2 * tick, 0)  # saturated cores
    assert not may_start_idle(SMALL_ITEM + 1, cpu)
    assert may_start_idle(SMALL_ITEM, cpu)
    _stat(stat, 2 * tick, 2 * tick)  # a core came free
    assert may_start_idle(64 * MB, cpu)
    _stat(stat, 4 * tick, 2 * tick)
    assert cpu.idle(window=IDLE_LOOK) < 0.1  # looked at within the writer's window: trusted


@pytest.mark.parametrize("warm_mb", [0, 32])
def test_staging_lands_on_pages_the_materializer_warmed_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm_mb: int
) -> None:
    """Every checkpoint byte staged into the warm part of the arena costs no page fault; with
    warming off (``FLORTRAIN_ARENA_WARM_MB=0``) each page of it faults."""
    if warm_mb and not _populate_supported():
        pytest.skip("this kernel cannot populate page tables (MADV_POPULATE_WRITE, Linux 5.14)")
    import torch

    monkeypatch.setenv("FLORTRAIN_ARENA_WARM_MB", str(warm_mb))

    store = Store(tmp_path / "s")
    run = store.begin_run("record", "x.py", [], "", None, None, {})
    results = Outcomes()
    m = BackgroundMaterializer(store, run, results.callbacks())
    m.warmer.join()
    assert m.warmer.done == warm_mb * MB
    table = torch.randn(16 * MB // 4)
    # the staging thread's faults: the copy into the arena runs on it (measured: 4,530 of the
    # process's 4,530 with the pages cold). The process's count also takes pytest-xdist's other
    # threads, which under load (staging then takes longer) once made it 989 with the pages warm
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    m.submit("k0", "B", {"objects": {"t": {"kind": "tensor", "value": table}}})
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
    m.flush()
    assert results.lost == {} and list(results.committed) == ["k0"]
    if warm_mb:
        assert faults < PAGES // 8, f"{faults} faults staging 16 MB into warm pages"
    else:
        assert faults >= PAGES * 9 // 10, f"{faults} faults staging 16 MB into pages never touched"
