"""Who may read a store, and whether its runs are alive.

A store holds pickled objects (checkpoint skeletons: a custom class, a ``random.Random``), and a
pickle is code to whoever loads it. So a store is loaded only when it is the user's own:

- **Private.** A store is created ``0700`` with ``0600`` files (:func:`private_dir`,
  :data:`FILE_MODE`): it also holds script sources and arguments.
- **Owned.** An existing store whose directory belongs to another user, or that others may write
  to, is refused (:func:`check_owner`).
- **Made by this user's flortrain.** A store's ``manifest.json`` carries an HMAC-SHA256 keyed with
  a secret only this user can read (``~/.config/flortrain/key``, ``0600``). A store copied in from
  elsewhere (a colleague's, a download: ``cp -r`` makes it yours by ownership) does not verify, so
  it is refused until the user says ``--trust``. :func:`adopt` then signs it, once, as the user's.

What this does not defend against: someone who can write into the user's ``0700`` directory or
read their key is the user, as far as the operating system is concerned.

Liveness is a lock, not a pid: a recording process holds an exclusive ``flock`` on its run's lock
file for its lifetime (:class:`RunLock`). The kernel drops the lock when the process dies however
it dies, and a recycled pid cannot hold it; ``os.kill(pid, 0)`` could say neither.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import stat
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from flortrain.errors import FlortrainError, Located
from flortrain.store import confine
from flortrain.store.confine import DIR_MODE, FILE_MODE, private_dir

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "flortrain-store/1"
#: The per-user secret; ``FLORTRAIN_KEY_FILE`` names another (tests, several identities).
KEY_ENV = "FLORTRAIN_KEY_FILE"

UNTRUSTED = "FT015"


def open_private(path: Path, flags: int) -> int:
    """``os.open`` creating ``path`` ``0600`` (the umask can only narrow it)."""
    return os.open(path, flags, FILE_MODE)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[int]:
    """A private temporary file beside ``path``, open for writing: renamed onto ``path`` when
    the block ends, removed if it raises. Nothing half-written is ever at ``path``, whoever
    reads it and however the writer dies; the directories are created private."""
    private_dir(path.parent)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_native_id()}")
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            yield fd
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _key_path() -> Path:
    explicit = os.environ.get(KEY_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "flortrain" / "key"


def user_key() -> bytes:
    """This user's secret, created on first use. Created under a temporary name and linked into
    place, so two first records racing agree on one key."""
    path = _key_path()
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        raise FlortrainError(
            f"cannot read the flortrain key: {e}", Located(str(path)), UNTRUSTED
        ) from None
    try:
        private_dir(path.parent)
        tmp = path.with_name(f".key.{os.getpid()}.{secrets.token_hex(4)}")
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, path)  # fails if another process won the race: use its key
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError) as e:
        raise FlortrainError(
            f"cannot create the flortrain key: {e}", Located(str(path)), UNTRUSTED
        ) from None


def _mac(body: dict[str, object]) -> str:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hmac.new(user_key(), text.encode(), hashlib.sha256).hexdigest()


def write_manifest(root: Path) -> None:
    """Sign a new store as this user's (atomically: a reader never sees half a manifest)."""
    body: dict[str, object] = {
        "format": MANIFEST_FORMAT,
        "store": uuid.uuid4().hex,
        "uid": os.getuid(),
        "created": time.time(),
    }
    data = json.dumps({**body, "mac": _mac(body)}, indent=2).encode()
    with replacing(root / MANIFEST) as fd, os.fdopen(fd, "wb", closefd=False) as f:
        f.write(data)


def manifest_problem(root: Path) -> str | None:
    """Why ``root``'s manifest does not prove the store is this user's, or None when it does."""
    try:
        doc = json.loads((root / MANIFEST).read_text())
    except FileNotFoundError:
        return "it has no manifest (it was not made by this user's flortrain)"
    except (OSError, ValueError) as e:
        return f"its manifest is unreadable ({e})"
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
        return "its manifest is not a flortrain manifest"
    mac = doc.pop("mac", None)
    if not isinstance(mac, str) or not hmac.compare_digest(mac, _mac(doc)):
        return (
            "its manifest does not verify with this user's key (made by someone else, or altered)"
        )
    return None


def check_owner(root: Path) -> str | None:
    """Why ``root`` may hold someone else's objects, or None: owned by this user, and writable by
    no one else."""
    st = root.stat()
    if st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by you (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"others can write to it (mode {stat.filemode(st.st_mode)})"
    return None


def verify(root: Path, trust: bool) -> None:
    """Refuse an existing store that is not provably the user's own, unless ``trust``; a trusted
    store is then made private and signed, so the user says ``--trust`` once per store."""
    problem = check_owner(root) or manifest_problem(root)
    if problem is None:
        return
    if not trust:
        raise FlortrainError(
            f"refusing to load this store: {problem}; its checkpoints are pickles, which run code when"
            " loaded. If you trust it, pass --trust once",
            Located(str(root)),
            UNTRUSTED,
        )
    adopt(root)


def adopt(root: Path) -> None:
    """Make a trusted store the user's: private modes, and a manifest signed with the user's key.
    A store the user cannot change (read-only, another owner) is still read, trusted this once."""
    with contextlib.suppress(OSError):
        os.chmod(root, DIR_MODE)
        write_manifest(root)


class RunLock:
    """Held (``flock`` exclusive) by a recording process for as long as it lives. The file
    descriptor is not inherited by programs the script ``exec``s; forked children (DataLoader
    workers, the materializer's writer) share it, so a run whose writer is still finishing reads
    as running, which it is."""

    def __init__(self, root: Path, run_id: int) -> None:
        self.path = lock_path(root, run_id)
        # a link planted at ``locks`` or at the lock file is refused, not followed
        self.fd = confine.open_file(root, _lock_rel(run_id), os.O_RDWR | os.O_CREAT)
        # blocking: a reader asking :func:`held` holds a shared lock for a moment
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def _lock_rel(run_id: int) -> str:
    return f"locks/run-{run_id}.lock"


def lock_path(root: Path, run_id: int) -> Path:
    return root / _lock_rel(run_id)


def held(root: Path, run_id: int) -> bool:
    """Whether some process holds run ``run_id``'s lock (it is alive). No lock file: the run was
    started by a flortrain that took none, or its store was copied without it: not alive."""
    try:
        fd = confine.open_file(root, _lock_rel(run_id), os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        return e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
    finally:
        os.close(fd)
    return False


__all__ = [
    "UNTRUSTED",
    "RunLock",
    "adopt",
    "check_owner",
    "held",
    "manifest_problem",
    "open_private",
    "replacing",
    "user_key",
    "verify",
    "write_manifest",
]
