"""Paths inside the store, and only there.

Every path the store reads or writes below its root is either built by flortrain (a run's blob
directory, an object's ``objects/ab/<name>``) or read back from the database (a checkpoint row's
``path``). A database is a file anyone who hands over a store can edit, and a directory in the
store can be replaced by a symbolic link, so neither is taken on trust:

- a relative path read from a row must stay below the root (:func:`relative`): no ``..``, no
  absolute path, no empty or ``.`` component;
- below the root, every directory is opened with ``O_NOFOLLOW`` from its parent's descriptor
  (:func:`_walk`), and files are created, renamed and read relative to that descriptor, so a
  symbolic link planted anywhere below the root is refused (``ELOOP``), never followed, and no
  byte is read from or written outside the store. The root itself is the user's choice (it may
  be reached through a link).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

DIR_MODE = 0o700
FILE_MODE = 0o600
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def private_dir(path: Path) -> None:
    """``mkdir -p`` where every directory created is ``0700`` whatever the umask (``Path.mkdir``
    gives parents the umask's mode)."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a concurrent record made it first
            d.mkdir(mode=DIR_MODE)
        os.chmod(d, DIR_MODE)  # mkdir's mode is masked by the umask; chmod's is not


def relative(rel: str) -> bool:
    """Whether ``rel`` names a path below a root: relative, with no ``..``, ``.`` or empty part."""
    if not rel or "\0" in rel or rel.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _parts(rel: str) -> tuple[list[str], str]:
    if not relative(rel):
        raise OSError(errno.EINVAL, "a path that leaves the store", rel)
    *dirs, name = PurePosixPath(rel).parts
    return dirs, name


def _walk(root: Path, dirs: list[str], create: bool) -> int:
    """A descriptor of ``root/dirs...``, each directory below ``root`` opened without following a
    link; missing ones (and ``root``) made ``0700`` when ``create``."""
    if create:
        private_dir(root)
    fd = os.open(root, _DIR)
    try:
        for d in dirs:
            made = False
            if create:
                try:
                    os.mkdir(d, DIR_MODE, dir_fd=fd)
                    made = True
                except FileExistsError:
                    pass
            nfd = os.open(d, _DIR | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if made:
                os.fchmod(fd, DIR_MODE)  # mkdir's mode is masked by the umask; fchmod's is not
    except BaseException:
        os.close(fd)
        raise
    return fd


def directory(root: Path, rel: str) -> None:
    """``mkdir -p root/rel``, private, refusing any symbolic link below ``root``."""
    dirs, name = _parts(rel)
    os.close(_walk(root, [*dirs, name], create=True))


@contextlib.contextmanager
def replacing(root: Path, rel: str) -> Iterator[int]:
    """A private temporary file beside ``root/rel``, open for writing, renamed onto it when the
    block ends and removed if it raises (as :func:`flortrain.store.trust.replacing`), with every
    directory below ``root`` opened without following a link."""
    dirs, name = _parts(rel)
    dfd = _walk(root, dirs, create=True)
    tmp = f".{name}.tmp{os.getpid()}.{threading.get_native_id()}"
    try:
        with contextlib.suppress(FileNotFoundError):  # left by a killed writer of this pid
            os.unlink(tmp, dir_fd=dfd)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE, dir_fd=dfd)
        try:
            try:
                yield fd
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
    finally:
        os.close(dfd)


def open_file(root: Path, rel: str, flags: int) -> int:
    """``os.open(root/rel, flags)`` (``0600`` if it creates), following no link below ``root``."""
    dirs, name = _parts(rel)
    dfd = _walk(root, dirs, create=bool(flags & os.O_CREAT))
    try:
        return os.open(name, flags | _NOFOLLOW, FILE_MODE, dir_fd=dfd)
    finally:
        os.close(dfd)


def read(root: Path, rel: str) -> bytes:
    """The bytes of ``root/rel``, following no link below ``root``."""
    with os.fdopen(open_file(root, rel, os.O_RDONLY), "rb") as f:
        return f.read()


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "directory",
    "open_file",
    "private_dir",
    "read",
    "relative",
    "replacing",
]
