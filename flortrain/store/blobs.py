"""Reading checkpoint blobs, wherever the blob store lives.

The store is split on purpose: the SQLite metadata (runs, blocks, logs) stays with the process
that records or drives a replay, while the blobs (``<run>/<key>.ft`` plus content-addressed
``objects/ab/<sha256>``) are plain immutable files that anyone holding the right URL can read.
A replay worker on another machine (the Ray backend) is given the blob store's location, a local
path on a shared filesystem or any fsspec URL (``s3://bucket/store/blobs``, ``gs://…``,
``file:///…``), and never opens the database. Every read is verified against the sha256 the
metadata recorded, so a blob store reached through a network is trusted no more than a local one.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

#: Verified content-addressed objects a replay keeps in memory (see ``BlobReader.read_object``).
OBJECT_CACHE_BYTES = 1 << 30


def is_url(location: str) -> bool:
    """Whether ``location`` names a blob store through fsspec rather than a local directory."""
    return "://" in location


def object_rel(sha: str) -> str:
    """A content-addressed object, relative to the blob store: ``objects/ab/abcdef...``."""
    return f"objects/{sha[:2]}/{sha}"


class BlobReader:
    """Verified reads of blobs and objects under one location (a directory or an fsspec URL)."""

    def __init__(self, location: str | Path) -> None:
        self.location = str(location)
        self._fs: Any = None
        self._objects: OrderedDict[str, bytes] = OrderedDict()
        self._objects_bytes = 0

    def _read(self, rel: str) -> bytes | None:
        if not is_url(self.location):
            try:
                return (Path(self.location) / rel).read_bytes()
            except OSError:
                return None
        if self._fs is None:
            import fsspec  # only a replay from a remote blob store needs it

            self._fs, self._root = fsspec.core.url_to_fs(self.location)
        try:
            data = self._fs.cat_file(f"{self._root.rstrip('/')}/{rel}")
        except (OSError, ValueError):  # fsspec maps a missing key to FileNotFoundError
            return None
        return bytes(data)

    def read_blob(self, rel: str, sha: str) -> bytes | None:
        """The blob, or None when it is missing or does not match its recorded hash."""
        data = self._read(rel)
        if data is None or hashlib.sha256(data).hexdigest() != sha:
            return None
        return data

    def read_object(self, sha: str) -> bytes | None:
        """A content-addressed tensor, or None when it is missing or its bytes do not hash to its
        name. A replay restores the same unchanged object (a frozen table) at every skipped
        instance: it is read and verified once, and the most recent are kept within a budget."""
        cached = self._objects.get(sha)
        if cached is not None:
            self._objects.move_to_end(sha)
            return cached
        data = self._read(object_rel(sha))
        if data is None or hashlib.sha256(data).hexdigest() != sha:
            return None
        self._objects[sha] = data
        self._objects_bytes += len(data)
        while self._objects_bytes > OBJECT_CACHE_BYTES and len(self._objects) > 1:
            _, old = self._objects.popitem(last=False)
            self._objects_bytes -= len(old)
        return data


__all__ = ["OBJECT_CACHE_BYTES", "BlobReader", "is_url", "object_rel"]
