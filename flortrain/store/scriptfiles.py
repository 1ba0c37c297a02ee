"""The ``files`` and ``file_states`` tables: the files a record's script opened, as it first found
them, and those it wrote as each checkpoint found them (``runtime/files.py``)."""

from __future__ import annotations

from collections.abc import Iterable

from flortrain.store.tables import Tables, guarded_write

#: a file a record's script opened: path, first (read | write), size, fingerprint, kept content
#: object, written, read back after writing
FileRow = tuple[str, str, int | None, str | None, str | None, bool, bool]
#: a file as a checkpoint found it: path, size (None: absent), fingerprint, content object
FileState = tuple[str, int | None, str | None, str | None]


class ScriptFiles(Tables):
    @guarded_write
    def put_files(self, run_id: int, rows: Iterable[FileRow]) -> None:
        """A record's files as its script first found them (``runtime/files.py``). A resumed
        record sees them again: what the killed part found first is kept."""
        self._transaction(
            [
                (
                    "INSERT INTO files VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (run_id, path) DO UPDATE SET"
                    " written = max(written, excluded.written), reread = max(reread, excluded.reread),"
                    " object = coalesce(object, excluded.object)",
                    [(run_id, *r) for r in rows],
                )
            ]
        )

    def files(self, run_id: int) -> list[FileRow]:
        """(path, first, size, fingerprint, object, written, reread) of each file the record's
        script opened, in the order it first did."""
        return [
            (p, f, n, d, o, bool(w), bool(r))
            for p, f, n, d, o, w, r in self.db.execute(
                "SELECT path, first, size, fingerprint, object, written, reread FROM files WHERE run_id=?"
                " ORDER BY rowid",
                (run_id,),
            )
        ]

    @guarded_write
    def put_file_states(self, run_id: int, rows: Iterable[tuple[str, FileState]]) -> None:
        """The files checkpoints found (key, (path, size, fingerprint, object))."""
        self._transaction(
            [
                (
                    "INSERT OR REPLACE INTO file_states VALUES (?,?,?,?,?,?)",
                    [(run_id, k, *st) for k, st in rows],
                )
            ]
        )

    def file_states(self, run_id: int) -> dict[str, list[FileState]]:
        """Per checkpoint key, the files a replay that restores it puts back."""
        out: dict[str, list[FileState]] = {}
        for k, p, n, d, o in self.db.execute(
            "SELECT key, path, size, fingerprint, object FROM file_states WHERE run_id=? ORDER BY rowid",
            (run_id,),
        ):
            out.setdefault(k, []).append((p, n, d, o))
        return out


__all__ = ["FileRow", "FileState", "ScriptFiles"]
