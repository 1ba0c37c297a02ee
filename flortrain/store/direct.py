"""Writing a content-addressed object without the page cache.

The materializer's writer shares two cores with training on a CPU-only machine, so every CPU cycle
it spends per checkpoint byte comes out of training (``checkpoint/period.py``). A buffered ``write``
of a large object costs CPU per byte (the copy into the page cache, dirty-page accounting, and the
kernel's writeback threads on top); ``O_DIRECT`` hands the staged pages to the disk as they are, for
a small fraction of that (docs/materializer.md). Hashing is then the writer's only per-byte work
(XXH3-128), and it is done once: the object's name is its hash, so the bytes are not hashed again on
the way out.

``O_DIRECT`` wants the buffer's address, the file offset and the length aligned to the device's
logical block size; :data:`ALIGN` (4096) is a multiple of every common one. The staging arena is
a page-aligned mapping and the materializer places large tensors at aligned offsets, so the
aligned prefix of an object goes direct and its last partial block buffered. A filesystem
without ``O_DIRECT`` (tmpfs), or a device that refuses the alignment, gets a buffered write:
the result on disk is the same bytes either way.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

from flortrain.store import confine

#: alignment of address, offset and length that O_DIRECT needs (a multiple of 512 and of 4096)
ALIGN = 4096
#: bytes per direct write call: large enough to keep the disk busy, small enough to stay
#: interruptible
_CHUNK = 16 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def aligned(offset: int) -> int:
    """``offset`` rounded up to :data:`ALIGN`."""
    return offset + (-offset % ALIGN)


def write_object(root: Path, rel: str, data: memoryview, direct: bool) -> None:
    """Write ``data`` to ``root/rel`` through a temporary file and a rename (no symbolic link
    below ``root`` followed), as
    :func:`flortrain.store.checkpoints.write_durably` does, but unhashed: the caller named the object by
    the hash it computed (``store/content.py``), and every read verifies it. ``direct``:
    ``data`` starts at an :data:`ALIGN`-aligned address, so its aligned prefix may bypass the page
    cache. On failure nothing is left at ``rel``."""
    with confine.replacing(root, rel) as fd:
        done = _write_direct(fd, data) if direct else 0
        _write_all(fd, data[done:])


def _write_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.write(fd, data[done : done + _CHUNK])


def _write_direct(fd: int, data: memoryview) -> int:
    """Write the aligned prefix of ``data`` with O_DIRECT; how many bytes were written (0 where
    the filesystem has no O_DIRECT). The descriptor is left buffered, at that offset."""
    n = len(data) - len(data) % ALIGN
    if not n or not _O_DIRECT:
        return 0
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | _O_DIRECT)
    except OSError:
        return 0
    done = 0
    try:
        while done < n:
            done += os.write(fd, data[done : min(n, done + _CHUNK)])
    except OSError as e:
        # EINVAL: this device wants another alignment, or a short write left the offset
        # unaligned; the rest goes buffered from where the file stands. Anything else (ENOSPC)
        # is the caller's.
        if e.errno != errno.EINVAL:
            raise
        done = os.lseek(fd, 0, os.SEEK_CUR)
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return done
