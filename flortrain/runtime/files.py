"""The files a recorded script reads and writes, seen through Python's audit hooks.

A replay is only as faithful as its inputs: a ``config.json`` edited since the record changes
the batch size under restored checkpoints, and a ``last.pt`` the record left behind makes an
auto-resuming script skip its training. So the training process of a record watches every file
the script opens (the ``open`` audit event: ``open``, ``io.open``, ``os.open``, and through them
``json.load``, ``numpy.load``, ``torch.load``), removes or renames, and notes for each one how it
first found it: its size and fingerprint (:func:`fingerprint`) and whether it read it before it
wrote it (an input) or wrote it first (an output). ``torch.save`` to a path writes from C++, out of
the hook's sight, and is reported to it (:func:`_see_torch_save`).

A file the script writes is an output, and a replay must see it as the record did at each point:
the record keeps (in the blob store, content-addressed, up to :data:`KEEP_BYTES`) the content an
existing file had when the script first wrote, moved or removed it (the replay's start puts it
back), and at each checkpoint the files written since the instance began, or since the run
began for a main-loop boundary (a skipped instance or a jump leaves them so). Only files under
the working directory are kept: one elsewhere is not the replay's to rewrite (``replay/files.py``
refuses a replay that needs it).

Not watched: files under the store, under the interpreter's prefixes (the standard library,
site-packages), ``/proc``, ``/dev``, ``/sys``, Python sources and their bytecode (the script and
its modules are checked as sources), and what DataLoader worker processes open (the hook runs
in the process that installed it; a worker's rows could not reach the store).
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from flortrain.store import content
from flortrain.store.blobs import object_rel
from flortrain.store.scriptfiles import FileRow, FileState
from flortrain.store.trust import replacing

#: Files up to this size are hashed whole; a larger one is fingerprinted by its size, its
#: modification time and its first and last blocks (reading a dataset of gigabytes at every
#: record and replay would cost more than the training it feeds).
HASH_WHOLE_BYTES = 64 << 20
#: The largest file whose content a record keeps (a larger one is named by its fingerprint only).
KEEP_BYTES = HASH_WHOLE_BYTES
_BLOCK = 1 << 20

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_SKIPPED_TREES = ("/proc/", "/dev/", "/sys/")


def fingerprint(path: str) -> tuple[int, str] | None:
    """The file's size and a fingerprint of its bytes, or None when there is no regular file
    there. Whole XXH3-128 (``x:``) up to :data:`HASH_WHOLE_BYTES`; beyond, ``s:`` over the size,
    the modification time and the first and last MB, so a large file touched since is seen as
    changed even when those blocks are not."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None  # a directory, a FIFO (opening one would block), a device
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            h = xxhash.xxh3_128()
            if st.st_size <= HASH_WHOLE_BYTES:
                while chunk := f.read(_BLOCK):
                    h.update(chunk)
                return st.st_size, "x:" + h.hexdigest()
            h.update(f"{st.st_size}:{st.st_mtime_ns}:".encode())
            h.update(f.read(_BLOCK))
            f.seek(st.st_size - _BLOCK)
            h.update(f.read(_BLOCK))
            return st.st_size, "s:" + h.hexdigest()
    except OSError:  # absent, or unreadable: not the file the record read
        return None


@dataclass
class Seen:
    """A file the script opened, as it first found it."""

    path: str  # absolute
    first: str  # "read" or "write": what the script did to it first
    size: int | None  # None: it did not exist
    digest: str | None
    written: bool = False
    #: read after the script had written it (what a replay that skipped the write would miss)
    reread: bool = False
    #: the number of the latest write event to it (:attr:`Watch.seq`)
    seq: int = 0
    #: the content it had when the script first wrote it, kept as a store object (None: absent,
    #: outside the working directory, or larger than :data:`KEEP_BYTES`)
    object: str | None = None


class Watch:
    """The files one record's script touches. Its hook sees every event of the process; it acts
    only while :attr:`active`, in the process and thread-state that is not already inside it."""

    def __init__(
        self, skip_roots: list[str], blobs: Path | None = None, cwd: str | None = None
    ) -> None:
        self.skip = tuple(os.path.join(os.path.realpath(r), "") for r in skip_roots)
        self.blobs = blobs  # where kept contents go (None: nothing is kept)
        self.cwd = os.path.join(os.path.realpath(cwd or os.getcwd()), "")
        self.seen: dict[str, Seen] = {}
        #: path -> (size, mtime_ns, inode) and the state a checkpoint last found: not copied again
        self._states: dict[str, tuple[tuple[int, int, int], FileState]] = {}
        #: checkpoint key -> the files it found, not yet stored
        self.pending: list[tuple[str, FileState]] = []
        self.seq = 0
        self.active = False
        self.pid = os.getpid()
        self._busy = threading.local()
        self._changed: dict[str, Seen] = {}  # rows not yet stored
        self._written: dict[str, Seen] = {}  # the files written, which checkpoints look at

    # -- the hook ------------------------------------------------------------------------------
    def event(self, name: str, args: tuple[Any, ...]) -> None:
        if not self.active or os.getpid() != self.pid or getattr(self._busy, "on", False):
            return
        self._busy.on = True
        try:
            self._event(name, args)
        except Exception:  # a file flortrain cannot name is not the script's problem
            pass
        finally:
            self._busy.on = False

    def _event(self, name: str, args: tuple[Any, ...]) -> None:
        if name == "open":
            path, _mode, flags = args
            if isinstance(path, int):
                return
            writes = bool(flags & _WRITE_FLAGS) if isinstance(flags, int) else False
            self._touch(path, None, writes)
        elif name == "os.remove":
            self._touch(args[0], args[1], True)
        elif name == "os.rename":
            self._touch(args[0], args[2], True)
            self._touch(args[1], args[3], True)
        elif name == "os.truncate" and not isinstance(args[0], int):
            self._touch(args[0], None, True)
        elif name == "shutil.rmtree":
            root = self._resolve(args[0], args[1])
            if root is not None:
                for f in _files_under(root):
                    self._touch(f, None, True)

    def _resolve(self, raw: Any, dir_fd: Any) -> str | None:
        try:
            p = os.fsdecode(os.fspath(raw))
        except TypeError:
            return None
        if not os.path.isabs(p) and isinstance(dir_fd, int) and dir_fd >= 0:
            p = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), p)
        return os.path.realpath(p)

    def _ignored(self, path: str) -> bool:
        return (
            path.startswith(self.skip)
            or path.startswith(_SKIPPED_TREES)
            or path.endswith((".py", ".pyc"))
            or "/__pycache__/" in path
        )

    def _touch(self, raw: Any, dir_fd: Any, writes: bool) -> None:
        path = self._resolve(raw, dir_fd)
        if path is None or self._ignored(path):
            return
        s = self.seen.get(path)
        if s is None:
            if os.path.isdir(path):
                return  # a directory's files are seen one by one
            fp = fingerprint(path)
            if fp is None and not writes:
                return  # a failing read, or a directory: nothing the script read
            s = self.seen[path] = self._changed[path] = Seen(
                path, "write" if writes else "read", *(fp or (None, None))
            )
        if writes:
            self.seq += 1
            s.seq = self.seq
            if not s.written:
                s.written = True
                self._changed[path] = self._written[path] = s
                if s.size is not None:
                    s.object = self._keep(path)
        elif s.written and not s.reread:
            s.reread = True
            self._changed[path] = s

    def _keep(self, path: str) -> str | None:
        """The file's content as a store object (its XXH3-128 name), or None when it is not kept."""
        if self.blobs is None or not path.startswith(self.cwd):
            return None
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size > KEEP_BYTES:
                    return None
                data = f.read()
        except OSError:
            return None
        name = content.name(data)
        target = self.blobs / object_rel(name)
        if not target.exists():
            with replacing(target) as fd, os.fdopen(fd, "wb", closefd=False) as out:
                out.write(data)
        return name

    # -- checkpoints -------------------------------------------------------------------------------
    def checkpoint(self, key: str, since: int) -> None:
        """Note, for checkpoint ``key``, the files under the working directory written after
        write event ``since`` (0: every one) as they are now: what a replay that restores it
        puts back. A file unchanged since the last checkpoint that found it is not read again."""
        if not self.active:
            return
        self._busy.on = True
        try:
            for s in self._written.values():
                if s.seq > since and s.path.startswith(self.cwd):
                    self.pending.append((key, self._state(s.path)))
        finally:
            self._busy.on = False

    def _state(self, path: str) -> FileState:
        try:
            st = os.stat(path)
        except OSError:
            self._states.pop(path, None)
            return (path, None, None, None)
        mark = (st.st_size, st.st_mtime_ns, st.st_ino)
        known = self._states.get(path)
        if known is not None and known[0] == mark:
            return known[1]
        fp = fingerprint(path)
        state: FileState = (
            (path, None, None, None) if fp is None else (path, fp[0], fp[1], self._keep(path))
        )
        self._states[path] = (mark, state)
        return state

    # -- what the record stores ------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        return bool(self._changed)

    def rows(self) -> list[FileRow]:
        """The rows of the files first seen or changed since the last call."""
        changed, self._changed = self._changed, {}
        return [
            (s.path, s.first, s.size, s.digest, s.object, s.written, s.reread)
            for s in changed.values()
        ]

    def take_states(self) -> list[tuple[str, FileState]]:
        out, self.pending = self.pending, []
        return out


def _files_under(root: str) -> Iterator[str]:
    for d, _, names in os.walk(root):
        for n in names:
            yield os.path.join(d, n)


_current: Watch | None = None
_installed = False


#: the events a watch acts on; the hook sees every event of the process (``builtins.id``,
#: ``exec``, ``import``...), so it returns on a set lookup for the others
_EVENTS = frozenset({"open", "os.remove", "os.rename", "os.truncate", "shutil.rmtree"})


def _hook(name: str, args: tuple[Any, ...]) -> None:
    if name not in _EVENTS:
        return
    w = _current
    if w is not None:
        w.event(name, args)


def _see_torch_save() -> None:
    """``torch.save(obj, "ckpt.pt")`` opens the file in C++ (``PyTorchFileWriter``), where no
    audit event is raised: its opener is wrapped to raise the ``open`` event Python's own
    ``open(path, "wb")`` would."""
    torch = sys.modules.get("torch")
    opener = getattr(getattr(torch, "serialization", None), "_open_zipfile_writer_file", None)
    if opener is None or getattr(opener, "_flortrain_seen", False):
        return
    init = opener.__init__

    def seen_init(self: Any, name: str, *args: Any, **kwargs: Any) -> None:
        sys.audit("open", name, "wb", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        init(self, name, *args, **kwargs)

    opener.__init__ = seen_init
    opener._flortrain_seen = True


@contextlib.contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Watch the script's files while the block runs (audit hooks cannot be removed: the one
    hook this process installs acts for the watch in place, none outside the block)."""
    global _current, _installed
    if not _installed:
        sys.addaudithook(_hook)
        _installed = True
    _see_torch_save()
    _current, watch.active = watch, True
    try:
        yield watch
    finally:
        watch.active = False
        _current = None


def put_back(states: Iterable[FileState], read_object: Callable[[str], bytes | None]) -> None:
    """Make each file as ``states`` found it: removed where it was absent, rewritten where its
    content differs and was kept. One not kept
    stays as it is: the replay refused up front where the script reads it (``replay/files.py``)."""
    for path, size, digest, obj in states:
        if size is None:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError, NotADirectoryError):
                os.unlink(path)
            continue
        if obj is None or fingerprint(path) == (size, digest):
            continue
        data = read_object(obj)
        if data is None:
            raise OSError(f"the record's copy of {path} is missing from the store")
        write_file(path, data)


def write_file(path: str, data: bytes) -> None:
    """Write ``path`` whole, in place where it exists: the same inode, so a handle the script
    holds open in append mode (a log) goes on appending to what it names."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def skip_roots(store_root: Path) -> list[str]:
    """What a watch leaves alone: the store, the interpreter's prefixes, flortrain itself."""
    roots = {str(store_root), sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots.add(str(Path(__file__).resolve().parent.parent))
    return sorted(roots)


__all__ = [
    "HASH_WHOLE_BYTES",
    "KEEP_BYTES",
    "FileState",
    "Seen",
    "Watch",
    "fingerprint",
    "put_back",
    "skip_roots",
    "watching",
    "write_file",
]
