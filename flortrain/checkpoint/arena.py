"""Warming the staging arena: its first pages mapped before training needs them.

Staging a checkpoint is one copy of each changed tensor into the arena (``materializer``), and
what that copy costs depends on the pages it lands on: under a hypervisor a page touched for the
first time costs a fault per 4 KB, several times the copy itself. Where the writer falls behind,
every checkpoint lands on fresh pages.

So before the script runs, while its imports keep one core busy and leave the other idle, a
thread asks the kernel to map the arena's first :func:`flortrain.knobs.arena_warm` bytes
writable in this process (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14 and later). It writes
nothing: staging may already be copying into those pages, and their bytes are left as they
are. The thread works in chunks and stops at the main loop's entry (:meth:`Warmer.stop`), so
a script that starts training at once does not compete with it for long. The writer process
maps the same pages for reading the same way, in its own idle time before the first item.

Pages faulted in by the *other* process do not help: the copy walks this process's page
tables. Elsewhere (another OS, an older kernel, a refused ``madvise``) nothing is warmed and
staging pays the faults. What it costs: the warmed pages are resident for the run (256 MB by
default, no more than an eighth of the memory available), and some CPU before training starts,
which is not free: the forked static pass keeps the other core busy then, and the warmer's
``madvise`` holds the address-space lock the imports' ``mmap`` calls wait for, so the loop
starts a little later; the first checkpoints, staged on warm pages, save more than that
(docs/materializer.md).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import threading
from collections.abc import Callable, Iterator

#: Linux's ``madvise`` advice values (``<linux/mman.h>``); ``mmap`` exposes them from 3.12 on.
MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
#: bytes per ``madvise`` call: small enough that :meth:`Warmer.stop` takes effect within a few ms
CHUNK = 16 << 20


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    """libc's ``madvise``, looked up once (a warmer calls it once per :data:`CHUNK`)."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def populate(
    area: mmap.mmap | memoryview, start: int, end: int, advice: int = MADV_POPULATE_WRITE
) -> bool:
    """Map ``area[start:end]`` (page-aligned ``start``) into this process's page tables without
    touching its bytes; False where the kernel cannot (nothing was done, or only part). The
    ctypes call releases the GIL, so the script's thread runs meanwhile."""
    fn = _madvise()
    if fn is None or end <= start:
        return fn is not None
    anchor = ctypes.c_char.from_buffer(area)  # an export: the mapping cannot close under us
    try:
        return fn(ctypes.addressof(anchor) + start, end - start, advice) == 0
    finally:
        del anchor


def populate_chunks(
    area: mmap.mmap | memoryview,
    nbytes: int,
    going: Callable[[], bool],
    advice: int = MADV_POPULATE_WRITE,
) -> Iterator[int]:
    """:func:`populate` ``area[:nbytes]`` a :data:`CHUNK` at a time while ``going()`` says so,
    yielding how far it has got after each chunk; it ends early where the kernel cannot."""
    done = 0
    while done < nbytes and going():
        end = min(done + CHUNK, nbytes)
        if not populate(area, done, end, advice):
            return
        done = end
        yield done


def resident_budget(requested: int, size: int, meminfo: str = "/proc/meminfo") -> int:
    """How much of an arena of ``size`` bytes to warm when ``requested``: no more than an eighth
    of the memory the system has available, in whole pages."""
    n = min(requested, size)
    with contextlib.suppress(OSError, ValueError), open(meminfo) as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                n = min(n, int(line.split()[1]) * 1024 // 8)
                break
    return n - n % mmap.PAGESIZE


class Warmer:
    """Warms ``area[:nbytes]`` on a thread, a :data:`CHUNK` at a time; :attr:`done` is how far
    it has got (read by the training thread to price staging)."""

    def __init__(self, area: mmap.mmap, nbytes: int) -> None:
        self.area = area
        self.nbytes = nbytes
        self.done = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.nbytes <= 0 or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="flortrain-warm", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for done in populate_chunks(self.area, self.nbytes, lambda: not self._stop.is_set()):
            self.done = done  # read by the training thread as the chunks land

    def stop(self) -> None:
        """Training has begun: whatever is not warm yet stays for staging to fault in."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def covers(self, end: int) -> bool:
        """Whether the arena's pages up to ``end`` are warm."""
        return end <= self.done
