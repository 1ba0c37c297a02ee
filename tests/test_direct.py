"""Objects written around the page cache (store/direct.py): the same bytes as a buffered write,
whatever the alignment, the length and the filesystem, and O_DIRECT really taken where the
filesystem has it."""

from __future__ import annotations

import errno
import mmap
import os
import stat
from pathlib import Path

import pytest

from flortrain.store import direct


def _arena(data: bytes) -> memoryview:
    """Bytes in a page-aligned mapping, as the materializer's staging arena holds them."""
    m = mmap.mmap(-1, direct.aligned(len(data)) + direct.ALIGN)
    m[: len(data)] = data
    return memoryview(m)


def _has_o_direct(where: Path) -> bool:
    probe = where / ".probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as e:
        assert e.errno == errno.EINVAL, e
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.mark.parametrize("n", [0, 17, direct.ALIGN, 3 * direct.ALIGN + 17, (5 << 20) + 1])
def test_any_length_round_trips(tmp_path: Path, n: int) -> None:
    data = os.urandom(n)
    path = tmp_path / "objects" / "ab" / "obj"
    direct.write_object(tmp_path, "objects/ab/obj", _arena(data)[:n], direct=True)
    assert path.read_bytes() == data
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["obj"]  # no temporary file left


def test_the_aligned_prefix_goes_direct_where_the_filesystem_allows(tmp_path: Path) -> None:
    data = os.urandom(3 * direct.ALIGN + 100)
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        done = direct._write_direct(fd, _arena(data)[: len(data)])
        assert os.lseek(fd, 0, os.SEEK_CUR) == done
        # the descriptor is buffered again: an unaligned tail is accepted
        direct._write_all(fd, _arena(data)[done : len(data)])
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == data
    assert done == (3 * direct.ALIGN if _has_o_direct(tmp_path) else 0)


def test_a_misaligned_buffer_falls_back_to_a_buffered_write(tmp_path: Path) -> None:
    data = os.urandom(4 * direct.ALIGN)
    view = _arena(b"x" + data)[1 : 1 + len(data)]  # one byte off the page
    direct.write_object(tmp_path, "obj", view, direct=True)
    assert (tmp_path / "obj").read_bytes() == data


def test_a_filesystem_without_o_direct_gets_a_buffered_write() -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm (tmpfs) on this machine")
    data = os.urandom(2 * direct.ALIGN + 5)
    path = shm / f"flortrain-direct-test-{os.getpid()}"
    try:
        direct.write_object(shm, path.name, _arena(data)[: len(data)], direct=True)
        assert path.read_bytes() == data
    finally:
        path.unlink(missing_ok=True)


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills up half-way (the real ENOSPC is the fault harness's, on a tmpfs)."""

    def full(fd: int, data: memoryview) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct, "_write_all", full)
    with pytest.raises(OSError, match="No space"):
        direct.write_object(tmp_path, "obj", _arena(os.urandom(9000))[:9000], direct=True)
    assert list(tmp_path.iterdir()) == []
