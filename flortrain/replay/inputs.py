"""The files a record read, checked before its replay: a replay restores the record's state
under the script's arithmetic, so an input that changed since (a batch size in ``config.json``,
a resized layer, other data) would give mixed output or a traceback blamed on a line the user
did not touch. Such a replay is refused naming the file, as a changed project module is
(``FT032``); ``--allow-changed-inputs`` runs it anyway, and says so."""

from __future__ import annotations

import os
import sys

from flortrain.errors import FlortrainError, Located
from flortrain.runtime.files import fingerprint
from flortrain.store.db import Store
from flortrain.store.records import Run

CHANGED_INPUT = "FT033"


def _size(n: int | None) -> str:
    return "absent" if n is None else f"{n} bytes"


def changed_inputs(store: Store, record: Run) -> list[tuple[str, str]]:
    """(path, how) of each file the record's script read before writing it that differs now."""
    out: list[tuple[str, str]] = []
    for path, first, size, digest, _, written, _ in store.files(record.id):
        if first != "read" or written:
            continue  # a file the script wrote is its output, put back by the replay (files.py)
        now = fingerprint(path)
        if now is None:
            out.append((path, "it is gone"))
        elif now != (size, digest):
            out.append(
                (path, "other contents" if now[0] == size else f"{_size(size)} then, {now[0]} now")
            )
    return out


def check_inputs(store: Store, record: Run, allow_changed: bool) -> None:
    """Refuse (``FT033``, exit 2) a replay of ``record`` whose inputs changed, unless allowed."""
    changed = changed_inputs(store, record)
    if not changed:
        return
    shown = [(os.path.relpath(p), how) for p, how in changed]
    if not allow_changed:
        path, how = shown[0]
        more = f" ({len(shown) - 1} more input(s) changed too)" if len(shown) > 1 else ""
        raise FlortrainError(
            f"changed since record {record.id} read it ({how}){more}: the replay would restore that run's state"
            " under other inputs; restore the file, or pass --allow-changed-inputs to replay anyway",
            Located(path),
            CHANGED_INPUT,
        )
    for path, how in shown:
        print(
            f"flortrain: warning: {path} changed since record {record.id} read it ({how}); replaying anyway"
            " (--allow-changed-inputs): what the replay prints may match neither run",
            file=sys.stderr,
        )


__all__ = ["CHANGED_INPUT", "changed_inputs", "check_inputs"]
