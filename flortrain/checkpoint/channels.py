"""Output channels: the objects a script writes to, which are not training state.

A logger, a file open for writing, a csv writer, a TensorBoard ``SummaryWriter``, a tqdm bar,
a W&B run: a loop writes to them as it writes to stdout. What they hold is where the output
goes (a lock, an open descriptor, a background thread, the logging manager's registry of
every logger, which torch extends lazily), none of which a checkpoint can or should hold. So
capture describes such an object as a channel and a restore leaves the live one where it is,
the side-effect audit does not image it, and the identity walk does not enter it. A skipped
instance writes nothing to a channel, as it prints nothing to stdout (docs/runtime.md).

A file open for reading (or for reading and writing) is not a channel: its position is input
state, which a skipped ``f.readline()`` loop must leave where the recorded one did.
"""

from __future__ import annotations

import io
import sys
from typing import Any

#: Classes of libraries that are channels, by the module their class is defined in (a prefix)
#: and the class name; matched along the object's MRO, so subclasses count, and without
#: importing the library (an object of it exists only if the script imported it).
LIBRARY_CHANNELS: frozenset[tuple[str, str]] = frozenset(
    {
        ("torch.utils.tensorboard", "SummaryWriter"),
        ("torch.utils.tensorboard", "FileWriter"),
        ("tensorboardX", "SummaryWriter"),
        ("tensorboardX", "FileWriter"),
        ("tensorboard", "EventFileWriter"),
        ("tqdm", "tqdm"),
        ("wandb", "Run"),
        ("mlflow", "ActiveRun"),
        ("csv", "DictWriter"),
        ("_csv", "writer"),
        ("_csv", "Writer"),
    }
)

#: type -> whether its objects are channels (``_FILE``: it depends on the file's mode). Asked of
#: every object a capture or an audit walks, so once per type; a type made before ``logging``
#: was imported cannot be a logger's.
_KNOWN: dict[type, bool | str] = {}
_FILE = "file"


def type_name(obj: Any) -> str:
    """``module.Qualname`` of an object's type, as a message names it (``_thread.lock``)."""
    cls = type(obj)
    module = getattr(cls, "__module__", None)
    name = getattr(cls, "__qualname__", cls.__name__)
    return name if module in (None, "builtins") else f"{module}.{name}"


def is_channel(obj: Any) -> bool:
    """Whether ``obj`` is where the script writes, not state (see the module docstring)."""
    cls = type(obj)
    known = _KNOWN.get(cls)
    if known is None:
        known = _classify(cls)
        _KNOWN[cls] = known
    if known == _FILE:
        return _write_only(obj)
    return bool(known)


def _classify(cls: type) -> bool | str:
    if issubclass(cls, io.IOBase):
        return _FILE
    logging = sys.modules.get("logging")
    if logging is not None and issubclass(
        cls, logging.Logger | logging.LoggerAdapter | logging.Handler | logging.Manager
    ):
        return True
    return any(
        c.__module__.startswith(prefix) and c.__name__ == name
        for c in cls.__mro__
        if isinstance(c.__module__, str)
        for prefix, name in LIBRARY_CHANNELS
    )


def level(obj: Any) -> int | None:
    """A logger's or handler's level: the one part of a channel a loop may set that decides
    what is written later (``if epoch == 3: log.setLevel(logging.DEBUG)``), kept with it."""
    logging = sys.modules.get("logging")
    if logging is not None and isinstance(obj, logging.Logger | logging.Handler):
        value = obj.level
        return value if isinstance(value, int) else None
    return None


def _write_only(f: io.IOBase) -> bool:
    """A file that is closed, or open for writing and not for reading (``open(p, "w")``,
    ``"a"``, sys.stdout): nothing in it is read back through this object."""
    try:
        return bool(f.closed) or (f.writable() and not f.readable())
    except (ValueError, OSError):
        return True  # a closed or detached stream
