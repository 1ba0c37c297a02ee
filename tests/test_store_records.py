"""The store's records are validated where they are read, and its paths stay inside it
(flortrain/store/records.py, flortrain/store/confine.py). No training: a store opened here and
rows written as a damaged disk or an edited database would leave them."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from flortrain.errors import FlortrainError
from flortrain.store import confine, schema
from flortrain.store.blobs import BlobReader, digest
from flortrain.store.checkpoints import write_durably
from flortrain.store.db import Store
from flortrain.store.records import (
    DAMAGED,
    MAX_THREADS,
    BlockRow,
    BlockState,
    Checkpoint,
    Damaged,
    Run,
    RunStatus,
)
from flortrain.store.schema import SCHEMA_VERSION


@pytest.mark.parametrize(
    ("rel", "inside"),
    [
        ("1/L1_M.0.1_0.ft", True),
        ("objects/ab/abcdef", True),
        ("x", True),
        ("../x", False),
        ("1/../../x", False),
        ("/etc/passwd", False),
        ("", False),
        ("1//x", False),
        ("./x", False),
        ("1/x/", False),
        ("1/\0x", False),
    ],
)
def test_a_relative_path_stays_below_its_root(rel: str, inside: bool) -> None:
    assert confine.relative(rel) is inside


def test_a_write_refuses_a_link_below_the_root_and_leaves_nothing(tmp_path: Path) -> None:
    root, outside = tmp_path / "blobs", tmp_path / "outside"
    outside.mkdir()
    write_durably(root, "1/a.ft", "a", [b"bytes"])
    os.symlink(outside, root / "2")
    with pytest.raises(OSError) as e:
        write_durably(root, "2/b.ft", "b", [b"bytes"])
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
    os.symlink(outside / "target", root / "1" / "c.ft.link")
    with pytest.raises(OSError):
        write_durably(root, "1/c.ft.link/d", "d", [b"bytes"])
    assert list(outside.iterdir()) == []
    assert sorted(p.name for p in (root / "1").iterdir()) == ["a.ft", "c.ft.link"]  # no temp


def test_a_write_replaces_a_link_at_its_own_name_without_following_it(tmp_path: Path) -> None:
    root, target = tmp_path / "blobs", tmp_path / "target"
    target.write_bytes(b"theirs")
    (root / "1").mkdir(parents=True)
    os.symlink(target, root / "1" / "a.ft")
    write_durably(root, "1/a.ft", "a", [b"ours"])
    assert target.read_bytes() == b"theirs"
    assert not (root / "1" / "a.ft").is_symlink()
    assert (root / "1" / "a.ft").read_bytes() == b"ours"


def test_a_read_refuses_a_link_or_a_path_out_of_the_blob_store(tmp_path: Path) -> None:
    root = tmp_path / "blobs"
    sha = write_durably(root, "1/a.ft", "a", [b"bytes"])
    assert sha == digest("a", b"bytes")
    reader = BlobReader(root)
    assert reader.read_blob(Checkpoint("a", "1/a.ft", sha, 5)) == b"bytes"
    (tmp_path / "a.ft").write_bytes(b"bytes")
    (root / "2").symlink_to(root / "1")
    for rel in ("../a.ft", str(tmp_path / "a.ft"), "2/a.ft"):
        assert reader.read_blob(Checkpoint("a", rel, sha, 5)) is None, rel
    assert reader.read_blob(Checkpoint("b", "1/a.ft", sha, 5)) is None  # another key's digest


def _run_row(**changes: Any) -> tuple[Any, ...]:
    row: dict[str, Any] = {
        "id": 1,
        "kind": "record",
        "script": "/x/train.py",
        "cwd": "/x",
        "argv": "[]",
        "source_sha": "ab" * 32,
        "parent": None,
        "started": 1.0,
        "finished": 2.0,
        "status": "complete",
        "exit_code": 0,
        "threads": 1,
        "pid": 10,
        "host": "h",
        "meta": "{}",
    }
    row.update(changes)
    return tuple(row.values())


def test_a_run_row_as_written_reads_back() -> None:
    run = Run.from_row(_run_row(threads=MAX_THREADS, argv=json.dumps(["--lr", "1"])), False)
    assert (run.threads, run.argv, run.duration) == (MAX_THREADS, ["--lr", "1"], 1.0)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("threads", 100000, "threads 100000"),
        ("threads", 0, "threads 0"),
        ("threads", "4", "threads '4'"),
        ("id", -1, "id -1"),
        ("kind", "exploit", "kind"),
        ("argv", "{not json", "argv is not JSON"),
        ("argv", '{"a": 1}', "argv is not a JSON list"),
        ("argv", "[1]", "argv is not a list of text"),
        ("meta", "[]", "meta is not a JSON dict"),
        ("started", "soon", "started"),
        ("started", float("nan"), "started"),
        ("pid", 1.5, "pid"),
        ("exit_code", 1 << 40, "exit_code"),
        ("script", None, "script"),
    ],
)
def test_a_damaged_run_row_says_which_field(field: str, value: object, why: str) -> None:
    with pytest.raises(Damaged, match=why.replace("(", r"\(").replace("[", r"\[")):
        Run.from_row(_run_row(**{field: value}), False)


@pytest.mark.parametrize(
    ("path", "sha", "nbytes", "why"),
    [
        ("../x", "ab" * 32, 1, "leaves the store"),
        ("/abs/x.ft", "ab" * 32, 1, "leaves the store"),
        ("1/x.ft", "AB" * 32, 1, "is not a sha256"),
        ("1/x.ft", "ab" * 31, 1, "is not a sha256"),
        ("1/x.ft", "ab" * 32, -1, "nbytes -1"),
        ("1/x.ft", "ab" * 32, "1", "nbytes '1'"),
        (7, "ab" * 32, 1, "path 7 is not text"),
    ],
)
def test_a_damaged_checkpoint_row_says_why(
    path: object, sha: str, nbytes: object, why: str
) -> None:
    with pytest.raises(Damaged, match=why):
        Checkpoint.from_row("k", path, sha, nbytes)


def test_the_store_refuses_a_damaged_row_in_one_line(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "/x/train.py", [], "text", None, 1, {})
    store.commit_checkpoint(run, "k", "../../x", "ab" * 32, 1)
    with pytest.raises(FlortrainError) as e:
        store.checkpoints(run)
    assert e.value.code == DAMAGED and "'k' of run 1" in e.value.one_line()
    store.db.execute("UPDATE runs SET meta='nope'")
    with pytest.raises(FlortrainError) as e:
        store.run(run)
    assert e.value.code == DAMAGED and "run 1" in e.value.one_line()
    assert "\n" not in e.value.one_line()
    store.close()


def test_a_store_of_an_earlier_schema_is_refused_in_one_line(tmp_path: Path) -> None:
    """Its checkpoint digests cover the blob's bytes alone: none could be trusted here."""
    Store(tmp_path / "s").close()
    raw = sqlite3.connect(tmp_path / "s" / "flortrain.db")
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION - 1}")
    raw.commit()
    raw.close()
    with pytest.raises(FlortrainError) as e:
        Store(tmp_path / "s")
    assert e.value.code == "FT014" and f"schema {SCHEMA_VERSION - 1}" in e.value.one_line()


def test_an_additive_change_migrates_a_store_of_the_version_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:data:`~flortrain.store.schema.MIGRATIONS` bring an older store to this schema when it is
    opened, in one transaction; a version they do not reach is refused."""
    Store(tmp_path / "s").close()
    raw = sqlite3.connect(tmp_path / "s" / "flortrain.db")
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION - 1}")
    raw.commit()
    raw.close()
    monkeypatch.setattr(
        schema, "MIGRATIONS", {SCHEMA_VERSION - 1: "CREATE TABLE extra (x INTEGER)"}
    )
    store = Store(tmp_path / "s")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("SELECT count(*) FROM extra").fetchone()[0] == 0
    store.close()
    monkeypatch.setattr(
        schema, "MIGRATIONS", {SCHEMA_VERSION - 2: "CREATE TABLE other (x INTEGER)"}
    )
    raw = sqlite3.connect(tmp_path / "s" / "flortrain.db")
    raw.execute(f"PRAGMA user_version={SCHEMA_VERSION - 2}")
    raw.commit()
    raw.close()
    with pytest.raises(FlortrainError, match="another version"):
        Store(tmp_path / "s")


def test_a_link_planted_at_the_database_or_the_lock_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Store(tmp_path / "s").close()
    os.symlink(elsewhere, tmp_path / "s" / "locks")
    store = Store(tmp_path / "s")
    with pytest.raises(FlortrainError, match=r"locks/run-1\.lock"):
        store.begin_run("record", "/x/train.py", [], "text", None, 1, {})
    assert store.runs() == []  # no row of the refused run
    store.close()
    os.unlink(tmp_path / "s" / "locks")
    os.rename(tmp_path / "s" / "flortrain.db", elsewhere / "flortrain.db")
    os.symlink(elsewhere / "flortrain.db", tmp_path / "s" / "flortrain.db")
    with pytest.raises(FlortrainError) as e:
        Store(tmp_path / "s")
    assert e.value.code == "FT010"
    assert list(elsewhere.iterdir()) == [elsewhere / "flortrain.db"]


def test_a_block_row_round_trips_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "s")
    run = store.begin_run("record", "/x/train.py", [], "text", None, 1, {})
    row = BlockRow(
        "L1@M.0.1#0",
        "L1",
        "M",
        0,
        1,
        0,
        BlockState.CHECKPOINTED,
        0.5,
        0.1,
        None,
        None,
        {"objects:m": "f1"},
    )
    store.put_block(run, row)
    assert store.blocks(run) == [row]
    assert store.blocks(run)[0].state is BlockState.CHECKPOINTED
    for column, value, why in [
        ("state", "exploded", "state 'exploded' is not a block state"),
        ("iteration", -3, "iteration -3"),
        ("state_sha", "[1]", "state_sha is not a JSON dict"),
        ("compute_s", "fast", "compute_s 'fast' is not a number"),
    ]:
        raw = sqlite3.connect(tmp_path / "s" / "flortrain.db")
        raw.execute(f"UPDATE blocks SET {column}=?", (value,))
        raw.commit()
        raw.close()
        with pytest.raises(FlortrainError) as e:
            store.blocks(run)
        assert e.value.code == DAMAGED and why in e.value.one_line(), e.value.one_line()
        store.put_block(run, row)
    store.close()


def test_a_run_status_not_one_flortrain_writes_is_refused() -> None:
    with pytest.raises(Damaged, match="status 'pwned' is not a run status"):
        Run.from_row(_run_row(status="pwned"), False)
    assert Run.from_row(_run_row(status="running"), False).effective_status == "incomplete"
    assert Run.from_row(_run_row(status="running"), True).effective_status == RunStatus.RUNNING


def test_a_jump_spanning_more_than_a_loop_could_is_refused(tmp_path: Path) -> None:
    """A replay's jump row is expanded to every iteration it skipped: a span of 10**12 would
    exhaust memory, a negative one would silently skip nothing."""
    store = Store(tmp_path / "s")
    run = store.begin_run("replay", "/x/train.py", [], "text", None, 1, {})
    store.put_jump(run, "M1", 0, 2, 5)
    assert store.jumped(run) == {("M1", 0, 2), ("M1", 0, 3), ("M1", 0, 4)}
    for first, resumed in ((0, 10**12), (5, 2), (-1, 3)):
        store.db.execute("UPDATE jumps SET first=?, resumed=?", (first, resumed))
        with pytest.raises(FlortrainError) as e:
            store.jumped(run)
        assert e.value.code == DAMAGED and "jump of run 1" in e.value.one_line()
    store.close()
