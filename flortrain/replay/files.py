"""The files a record wrote, as its replay must see them.

A replay runs the script's prologue again, skips instances and jumps over iterations, so each
file the record wrote must be, at every point, what the record had there: a script that wipes
``ckpt/`` and saves ``ckpt/best.pt`` on improvement loads it after the loop (a jump over the
iteration that saved it left no file), and one that resumes from ``last.pt`` when it exists
found the record's ``last.pt`` and trained nothing. So before the script runs, every file the
record wrote is made as the record found it at its start: one it created is set aside into the
store (``aside/replay-<run>/``, nothing is deleted, and what the replay does not write again is
moved back after it), one it overwrote gets its kept content back; and restoring a checkpoint puts back the files as that checkpoint found them
(``runtime/files.py``). Where that cannot be done and the script reads the file, the replay is
refused up front naming it (``FT034``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from flortrain.errors import FlortrainError, Located
from flortrain.runtime.files import KEEP_BYTES, fingerprint, write_file
from flortrain.store.db import Store
from flortrain.store.records import Run
from flortrain.store.scriptfiles import FileState

UNRESTORABLE_FILE = "FT034"


@dataclass
class Prologue:
    """What the replay's start does to the files, and what its restores put back."""

    cwd: str
    aside: list[str] = field(default_factory=list)  # created by the record: set aside
    restore: list[tuple[str, str]] = field(
        default_factory=list
    )  # (path, object): overwritten by it
    states: dict[str, list[FileState]] = field(default_factory=dict)  # per checkpoint key
    written: list[str] = field(default_factory=list)  # every file the record wrote there
    #: the files it wrote that its script also read (a parallel replay's workers would race on them)
    read_back: list[str] = field(default_factory=list)
    aside_dir: Path | None = None
    moved: list[str] = field(default_factory=list)  # set aside by begin_files

    def shown(self, path: str) -> str:
        return os.path.relpath(path, self.cwd)


def _refuse(path: str, why: str) -> FlortrainError:
    return FlortrainError(why, Located(os.path.relpath(path)), UNRESTORABLE_FILE)


def plan_files(store: Store, record: Run) -> Prologue:
    """The prologue of a replay of ``record``, or a one-line refusal naming a file the script
    reads that the replay cannot give it as the record had it."""
    cwd = os.path.join(os.path.realpath(record.cwd), "")
    p = Prologue(cwd)
    p.states = store.file_states(record.id)
    unkept = {
        path
        for sts in p.states.values()
        for path, size, _, obj in sts
        if size is not None and obj is None
    }
    limit = f"{KEEP_BYTES >> 20} MB"
    for path, first, size, digest, obj, written, reread in store.files(record.id):
        if not written:
            continue  # an input: replay/inputs.py
        reads = first == "read" or reread
        if not path.startswith(cwd):
            if reads:
                raise _refuse(
                    path,
                    f"record {record.id} wrote this file and its script reads it, but it is outside the"
                    " working directory, where a replay does not put files back: write it under it",
                )
            continue
        p.written.append(path)
        if reads:
            p.read_back.append(path)
        if reads and path in unkept:
            raise _refuse(
                path,
                f"record {record.id} wrote this file larger than {limit} (not kept) and its script reads"
                " it back: a replay that skips what wrote it cannot put it back",
            )
        now = fingerprint(path)
        if size is None:
            if now is not None or os.path.lexists(path):
                p.aside.append(path)
        elif now != (size, digest):
            if obj is not None:
                p.restore.append((path, obj))
            elif reads:
                raise _refuse(
                    path,
                    f"changed since record {record.id} found it, and at over {limit} the record did not"
                    " keep it: put it back as it was to replay",
                )
    return p


def begin_files(p: Prologue, store: Store, run: int) -> None:
    """Make the files as the record found them at its start, saying what moved where."""
    if not (p.aside or p.restore):
        return
    aside = p.aside_dir = store.root / "aside" / f"replay-{run}"
    moved = p.moved = p.aside + [path for path, _ in p.restore if os.path.lexists(path)]
    for path in moved:
        target = aside / p.shown(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(path, target)
    for path, obj in p.restore:
        data = store.read_object(obj)
        if data is None:
            raise _refuse(
                path,
                "the record's copy of this file is missing from the store: it cannot be put back",
            )
        write_file(path, data)
    said = []
    if moved:  # moved back after the replay where it did not write them again (end_files)
        names = ", ".join(p.shown(x) for x in moved)
        said.append(f"{len(moved)} set aside into {os.path.relpath(aside)} ({names})")
    if p.restore:
        said.append(
            f"{len(p.restore)} put back as the record found them ({', '.join(p.shown(x) for x, _ in p.restore)})"
        )
    print(
        f"flortrain: files: the script starts from the files its record started from: {'; '.join(said)}",
        file=sys.stderr,
    )


def end_files(p: Prologue) -> None:
    """After the replay: a file set aside that the replay did not write again goes back (a
    TensorBoard event file named by the record's start time stays the user's), one it wrote
    again the same is dropped; one it wrote differently stays aside, and stderr says where."""
    if p.aside_dir is None:
        return
    kept = []
    for path in p.moved:
        target = p.aside_dir / p.shown(path)
        if not os.path.lexists(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.move(target, path)
        elif fingerprint(path) is not None and fingerprint(path) == fingerprint(str(target)):
            os.unlink(target)
        else:
            kept.append(p.shown(path))
    for d, _, _ in sorted(os.walk(p.aside_dir), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(d)  # the empty ones
    if kept:
        print(
            f"flortrain: files: the record's {', '.join(kept)} (rewritten otherwise by the replay) kept in"
            f" {os.path.relpath(p.aside_dir)}",
            file=sys.stderr,
        )


__all__ = ["UNRESTORABLE_FILE", "Prologue", "begin_files", "end_files", "plan_files"]
